"""The job's graph without Ray: edges from declarations, which stages may start, the critical path."""

from __future__ import annotations

import pytest

from augsbert_ray.graph import Demand, Node, critical_path, dependencies, ready, startable, upstream


def _job() -> list[Node]:
    """The in-domain job's shape: what each stage reads, as its declaration names it."""
    return [
        Node("gold", outputs=("train.parquet", "dev.parquet")),
        Node("cross_encoder", ("gold/train.parquet",), ("model",)),
        Node("eval_cross_encoder", ("gold/dev.parquet", "cross_encoder/model"), ("scores.json",)),
        Node("eval_zero_shot", ("gold/dev.parquet",), ("scores.json",)),
        Node("gold_only", ("gold/train.parquet",), ("model",)),
        Node("eval_gold_only", ("gold/dev.parquet", "gold_only/model"), ("scores.json",)),
        Node("teacher_check", ("eval_cross_encoder/scores.json", "eval_gold_only/scores.json"), ("check.json",)),
        Node("candidates", ("gold/train.parquet",), ("candidates.parquet",)),
        Node("silver", ("candidates/candidates.parquet", "cross_encoder/model"), ("silver.parquet",),
             after=("teacher_check",)),
        Node("augsbert", ("gold/train.parquet", "silver/silver.parquet"), ("model",)),
    ]


def test_edges_come_from_the_declared_inputs_and_the_declared_order():
    deps = dependencies(_job())
    assert deps["cross_encoder"] == deps["gold_only"] == deps["candidates"] == deps["eval_zero_shot"] == ("gold",)
    assert deps["silver"] == ("cross_encoder", "teacher_check", "candidates")
    assert deps["augsbert"] == ("gold", "silver")
    # an input no stage of the graph produces is the caller's (e.g. artifacts found earlier)
    assert dependencies([Node("pilot", ("auto/0", "gold/train.parquet"))]) == {"pilot": ()}
    with pytest.raises(ValueError, match="cycle: a -> b -> a"):
        dependencies([Node("a", ("b/x",), ("x",)), Node("b", ("a/x",), ("x",))])
    with pytest.raises(ValueError, match="repeat"):
        dependencies([Node("a"), Node("a")])


def test_independent_stages_are_ready_together_in_the_jobs_order():
    deps = dependencies(_job())
    assert ready(deps, done=[], started=[]) == ["gold"]
    assert ready(deps, ["gold"], []) == ["cross_encoder", "eval_zero_shot", "gold_only", "candidates"]
    assert ready(deps, ["gold"], ["cross_encoder"]) == ["eval_zero_shot", "gold_only", "candidates"]
    # labelling waits for the teacher check though it reads nothing of it
    finished = ["gold", "cross_encoder", "eval_cross_encoder", "candidates", "gold_only"]
    assert "silver" not in ready(deps, finished, [])
    assert "silver" in ready(deps, finished + ["eval_gold_only", "teacher_check"], [])
    assert upstream(deps, {"silver"}) == set(deps) - {"eval_zero_shot", "augsbert"}


def test_stages_start_only_where_they_fit():
    deps = dependencies(_job())
    heavy = {name: Demand(cpus=2) for name in deps}
    two = Demand(cpus=2)
    # two CPUs: one stage that takes both at a time, the job's order deciding which
    assert startable(deps, ["gold"], {}, heavy, two) == ["cross_encoder"]
    assert startable(deps, ["gold"], {"cross_encoder": two}, heavy, two) == []
    # one CPU each: two at once; a stage that needs nothing always starts
    small = {name: Demand(cpus=1) for name in deps} | {"eval_zero_shot": Demand()}
    assert startable(deps, ["gold"], {}, small, two) == ["cross_encoder", "eval_zero_shot", "gold_only"]
    # a GPU shared by fractions
    gpu = {name: Demand(cpus=1, gpus=0.5) for name in deps}
    assert startable(deps, ["gold"], {}, gpu, Demand(cpus=16, gpus=1)) == ["cross_encoder", "eval_zero_shot"]
    # more than the whole cluster: alone, never starved
    assert startable(deps, ["gold"], {}, {"cross_encoder": Demand(cpus=8)}, two)[0] == "cross_encoder"
    # no cluster yet: what needs one starts alone, what needs none beside it
    assert startable(deps, ["gold"], {}, small, None) == ["cross_encoder", "eval_zero_shot"]


def test_the_remaining_time_is_the_longest_chain():
    deps = dependencies(_job())
    left = {"cross_encoder": 50, "eval_cross_encoder": 20, "gold_only": 50, "eval_gold_only": 2, "candidates": 15,
            "silver": 22, "augsbert": 100, "eval_zero_shot": 3}
    # teacher (50) + its scoring (20) + the check (0) + labels (22) + the student (100); the rest runs beside
    assert critical_path(deps, left) == 192
    chain = {name: tuple(list(deps)[:i]) for i, name in enumerate(deps)}
    assert critical_path(chain, left) == sum(left.values())
