"""The stage runner on toy stages (no Ray): reuse, resumption, --fresh, outputs, declared reads."""

from __future__ import annotations

import json
import time

import pytest

from augsbert_ray.config import validate_tree
from augsbert_ray.rundir import RunDir
from augsbert_ray.runner import Runner, publish
from augsbert_ray.stages.base import Declaration, Settings, Stage, UndeclaredSetting


def _cfg(**extra):
    return validate_tree({"name": "toy", "data": {s: {"format": "stsb", "path": f"{s}.csv"}
                                                   for s in ("train", "dev", "test")}, **extra})


class Source(Stage):
    """Writes a number that depends on cross_encoder.epochs; "resumes" from a partial file."""

    name = "source"
    needs_ray = False

    def __init__(self):
        self.calls = []

    def declare(self, cfg):
        return Declaration(reads=("cross_encoder.epochs", "labeling.actors"), outputs=("n.json",))

    def run(self, inputs, settings, env):
        partial = env.out / "partial"
        resumed = partial.exists()  # what a checkpoint left by an interrupted run looks like
        partial.write_text("state")
        self.calls.append({"resumed": resumed, "fresh": env.fresh})
        (env.out / "n.json").write_text(json.dumps(settings.cross_encoder.epochs * 10))
        return {"n": settings.cross_encoder.epochs * 10, "resumed": resumed}


class Double(Stage):
    name = "double"
    needs_ray = False

    def __init__(self):
        self.calls = 0

    def declare(self, cfg):
        return Declaration(reads=("seed",), inputs={"n": "source/n.json"}, outputs=("out.json",))

    def run(self, inputs, settings, env):
        self.calls += 1
        value = inputs.json("n") * 2 + settings.seed
        (env.out / "out.json").write_text(json.dumps(value))
        return {"value": value}


def test_a_finished_stage_is_reused_and_a_changed_setting_gets_its_own_folder(tmp_path):
    rd = RunDir(tmp_path / "run")
    src, dbl = Source(), Double()
    first = Runner(_cfg(), rd).run(src)
    again = Runner(_cfg(), rd).run(src)
    assert not first.reused and again.reused and len(src.calls) == 1 and again.result == first.result
    changed = Runner(_cfg(cross_encoder={"epochs": 7}), rd)
    done = changed.run(src)
    assert done.result["n"] == 70 and done.folder != first.folder
    assert src.calls[-1] == {"resumed": False, "fresh": False}  # nothing of the other setting's run is seen
    assert changed.run(dbl).result["value"] == 140 + 42
    # Back to the first setting: its folder is still there and is reused.
    assert Runner(_cfg(), rd).run(src).reused and len(src.calls) == 2


def test_placement_settings_never_redo_a_stage(tmp_path):
    rd = RunDir(tmp_path / "run")
    src = Source()
    Runner(_cfg(), rd).run(src)
    assert Runner(_cfg(labeling={"actors": 5}), rd).run(src).reused and len(src.calls) == 1


def test_an_interrupted_stage_resumes_in_its_folder_and_fresh_starts_over(tmp_path):
    rd = RunDir(tmp_path / "run")
    src = Source()
    runner = Runner(_cfg(), rd)
    folder = runner.folder(src, runner.fingerprint(src))
    folder.mkdir(parents=True)
    (folder / "partial").write_text("state")  # a run that died before its marker
    assert runner.run(src).result["resumed"] is True
    done = Runner(_cfg(), rd, fresh=True).run(src)  # --fresh: the stage's folder is emptied first
    assert not done.reused and src.calls[-1] == {"resumed": False, "fresh": True}


def test_a_missing_output_redoes_the_stage_and_dependants_follow(tmp_path):
    rd = RunDir(tmp_path / "run")
    src, dbl = Source(), Double()
    runner = Runner(_cfg(), rd)
    done = runner.run(src)
    runner.run(dbl)
    (done.folder / "n.json").unlink()
    lines = []
    again = Runner(_cfg(), rd, lines.append)
    assert not again.run(src).reused and again.run(dbl).reused  # same content, same fingerprint downstream
    assert any("n.json is missing or changed; redoing it" in line for line in lines)


def test_a_stage_reads_only_what_it_declares(tmp_path):
    class Sneaky(Source):
        name = "sneaky"

        def run(self, inputs, settings, env):
            return {"lr": settings.cross_encoder.lr}  # declared: cross_encoder.epochs only

    with pytest.raises(UndeclaredSetting, match="read 'cross_encoder.lr'"):
        Runner(_cfg(), RunDir(tmp_path / "run")).run(Sneaky())
    view = Settings(_cfg(), frozenset({"sampling"}), "x")
    assert view.sampling.faiss.index == "flat"  # a whole section is readable
    with pytest.raises(UndeclaredSetting):
        view.seed
    with pytest.raises(AttributeError):
        view.sampling.top_k = 4


def test_a_stage_must_write_what_it_declares(tmp_path):
    class Lazy(Source):
        name = "lazy"

        def run(self, inputs, settings, env):
            return {}

    with pytest.raises(RuntimeError, match="did not write n.json"):
        Runner(_cfg(), RunDir(tmp_path / "run")).run(Lazy())


def test_publish_replaces_the_target_with_links(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "w.bin").write_text("one")
    target = tmp_path / "run" / "models" / "m"
    publish(src, target)
    assert (target / "w.bin").read_text() == "one" and (target / "w.bin").stat().st_ino == (src / "w.bin").stat().st_ino
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.bin").write_text("two")
    publish(other, target)
    assert sorted(p.name for p in target.iterdir()) == ["x.bin"]


class Meet(Stage):
    """A stage that finishes only once every stage of its group has started: they ran at once."""

    needs_ray = False

    def __init__(self, name: str, group, reads_from: str | None = None, fail: bool = False, delay: float = 0.0):
        self.name, self.group, self.reads_from, self.fail, self.delay = name, group, reads_from, fail, delay

    def declare(self, cfg):
        inputs = {"before": f"{self.reads_from}/out.json"} if self.reads_from else {}
        return Declaration(inputs=inputs, outputs=("out.json",))

    def run(self, inputs, settings, env):
        if self.group is not None:
            self.group.wait(timeout=10)  # threading.Barrier: broken (an error) if the others never come
        if self.fail:
            raise RuntimeError(f"{self.name} failed")
        time.sleep(self.delay)
        (env.out / "out.json").write_text("1")
        return {}


def test_independent_stages_run_at_once_and_dependants_wait(tmp_path):
    import threading

    both = threading.Barrier(2)
    order = []
    runner = Runner(_cfg(), RunDir(tmp_path / "run"))
    stages = [Meet("a", both), Meet("b", both), Meet("c", None, reads_from="a")]
    runner.run_graph(stages, after=lambda stage, done: order.append(stage.name))
    assert set(order[:2]) == {"a", "b"} and order[2] == "c"  # a and b waited for each other: they overlapped
    assert set(runner.done) == {"a", "b", "c"} and runner.artifacts["c/out.json"].path.exists()


def test_the_first_failing_stage_stops_the_job_after_the_others_end(tmp_path):
    import threading

    both = threading.Barrier(2)
    runner = Runner(_cfg(), RunDir(tmp_path / "run"))
    stages = [Meet("a", both, fail=True), Meet("b", both, delay=0.5), Meet("c", None, reads_from="b")]
    with pytest.raises(RuntimeError, match="a failed"):
        runner.run_graph(stages)
    assert set(runner.done) == {"b"}  # b, running beside it, finished; c never started
