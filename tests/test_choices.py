"""The job's choices without a cluster: calibrating silver labels, the model shipped, the
autopilot's settings, the pilots' training sets."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from augsbert_ray import schema
from augsbert_ray.config import validate_tree
from augsbert_ray.errors import ConfigError
from augsbert_ray.rundir import RunDir


def _cfg(tmp_path, **extra):
    return validate_tree({"name": "c", "run_dir": str(tmp_path / "run"),
                          "data": {s: {"format": "stsb", "path": f"{s}.csv"} for s in ("train", "dev", "test")},
                          **extra})


def test_calibration_maps_a_compressed_teacher_onto_the_gold_scale():
    from augsbert_ray.stages.silver import fit_calibration

    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 1, 400)
    teacher = 0.4 + 0.2 * gold + rng.normal(0, 0.01, 400)  # right order, squeezed into [0.4, 0.6]
    mapping = fit_calibration(teacher, gold)
    after = mapping(teacher)
    assert abs(after.mean() - gold.mean()) < 0.02 and after.std() > 3 * teacher.std()
    grid = np.linspace(0, 1, 50)
    assert (np.diff(mapping(grid)) >= 0).all()  # increasing: the teacher's ranking is kept
    assert mapping(np.array([0.0]))[0] >= 0 and mapping(np.array([1.0]))[0] <= 1  # outside dev's range: clipped


def _runner(tmp_path, cfg, artifacts: dict):
    from augsbert_ray.runner import Runner
    from augsbert_ray.stages.base import Artifact

    runner = Runner(cfg, RunDir(tmp_path / "run"))
    for aid, path in artifacts.items():
        runner.artifacts[aid] = Artifact(path, aid)
    return runner


@pytest.mark.parametrize("policy,aug,gold,expected", [("better", 80.0, 82.0, "gold_only"),
                                                      ("better", 83.0, 82.0, "augsbert"),
                                                      ("augsbert", 80.0, 82.0, "augsbert"),
                                                      # NaN: a model that scored every dev pair the same
                                                      ("better", float("nan"), 82.0, "gold_only"),
                                                      ("better", 80.0, float("nan"), "augsbert"),
                                                      # equal as shown: a tie, not a lead
                                                      ("better", 66.23, 66.23, "augsbert"),
                                                      ("better", 66.2301, 66.2304, "gold_only")])
def test_the_job_ships_the_better_model_on_dev(tmp_path, policy, aug, gold, expected):
    from augsbert_ray.stages import Ship

    artifacts = {}
    for name, score in (("augsbert", aug), ("gold_only", gold)):
        model = tmp_path / name
        model.mkdir()
        (model / "model.safetensors").write_text(name)
        scores = tmp_path / f"{name}.json"
        scores.write_text(json.dumps({"dev": {"spearman": score}, "test": {"spearman": 0.0}}))
        artifacts[f"{name}/model"], artifacts[f"eval_{name}/scores.json"] = model, scores
    cfg = _cfg(tmp_path, evaluation={"shipping": policy})
    done = _runner(tmp_path, cfg, artifacts).run(Ship())
    assert done.result.shipped == expected
    assert (tmp_path / "run" / "models" / "bi-encoder" / "model.safetensors").read_text() == expected
    assert done.result.augsbert_dev == pytest.approx(aug, nan_ok=True)
    assert done.result.gold_only_dev == pytest.approx(gold, nan_ok=True)
    if np.isnan(aug) or np.isnan(gold):
        assert "undefined" in done.result.why
    elif policy == "better":
        assert ("tie on dev" in done.result.why) is (f"{aug:.2f}" == f"{gold:.2f}")
        assert ("leads" in done.result.why) is (f"{aug:.2f}" != f"{gold:.2f}")


def test_the_autopilot_tries_every_combination_teachers_first(tmp_path):
    from augsbert_ray.stages.auto import settings_to_try

    cfg = _cfg(tmp_path, auto={"enabled": True, "teacher_recipes": [[4, 2e-5], [8, 5e-5]], "strategies": ["bm25"],
                               "top_k": [3, 10], "calibration": ["none", "isotonic"]})
    tried = settings_to_try(cfg.auto)
    assert len(tried) == 8 and [s.overrides["cross_encoder.epochs"] for s in tried] == [4] * 4 + [8] * 4
    job = tried[-1].apply(cfg)
    assert (job.cross_encoder.epochs, job.cross_encoder.lr, job.sampling.top_k, job.labeling.calibration) == \
        (8, 5e-5, 10, "isotonic")
    assert not job.auto.enabled and job.data == cfg.data  # a plain job of its own
    assert all("bi_encoder.gold_repeat" not in s.overrides and "gold x" not in s.label for s in tried)
    with pytest.raises(Exception, match="at least one"):
        _cfg(tmp_path, auto={"enabled": True, "top_k": []})
    with pytest.raises(Exception, match="gold_repeat: give at least one"):
        _cfg(tmp_path, auto={"enabled": True, "gold_repeat": []})


def test_the_autopilot_tries_gold_repeat_innermost(tmp_path):
    from augsbert_ray.stages.auto import settings_to_try

    cfg = _cfg(tmp_path, auto={"enabled": True, "teacher_recipes": [[4, 2e-5]], "strategies": ["bm25"],
                               "top_k": [3, 10], "calibration": ["none"], "gold_repeat": [1, 3]})
    tried = settings_to_try(cfg.auto)
    assert [s.label for s in tried] == [
        "teacher 4x2e-05, bm25 top-3, calibration none, gold x1", "teacher 4x2e-05, bm25 top-3, calibration none, gold x3",
        "teacher 4x2e-05, bm25 top-10, calibration none, gold x1", "teacher 4x2e-05, bm25 top-10, calibration none, gold x3"]
    jobs = [s.apply(cfg) for s in tried]
    assert [j.bi_encoder.gold_repeat for j in jobs] == [1, 3, 1, 3]
    assert [j.sampling.top_k for j in jobs] == [3, 3, 10, 10]
    with pytest.raises(Exception, match="greater than 0"):
        _cfg(tmp_path, auto={"enabled": True, "gold_repeat": [0]})


def test_the_autopilot_tries_objectives_innermost_and_shares_the_silver_stages(tmp_path):
    from augsbert_ray.stages.auto import _stage_config, job_setting, settings_to_try

    grid = {"enabled": True, "teacher_recipes": [[4, 2e-5]], "strategies": ["bm25+ss"], "top_k": [3],
            "calibration": ["none"], "gold_repeat": [1, 3], "objective": ["cosine", "cosent-distill"]}
    cfg = _cfg(tmp_path, auto=grid, bi_encoder={"objective": "angle"})
    tried = settings_to_try(cfg.auto)
    assert [s.label.split(", ")[-2:] for s in tried] == [
        ["gold x1", "cosine objective"], ["gold x1", "cosent-distill objective"],
        ["gold x3", "cosine objective"], ["gold x3", "cosent-distill objective"]]
    assert [s.apply(cfg).bi_encoder.objective for s in tried] == ["cosine", "cosent-distill"] * 2
    # The stages before the pilot (semantic search's gold-only student among them) run with the
    # job's own objective: settings that differ only in it share the candidates and the labels.
    staged = [_stage_config(s, cfg) for s in tried]
    assert {c.bi_encoder.objective for c in staged} == {"angle"} and staged[0] == staged[1]
    assert staged[2].bi_encoder.gold_repeat == 3
    own = job_setting(cfg)
    assert own.label.endswith("gold x1, angle objective") and own.overrides["bi_encoder.objective"] == "angle"
    assert "objective" not in job_setting(_cfg(tmp_path, auto={**grid, "objective": None})).label
    auto = _cfg(tmp_path, auto=grid, sampling={"strategy": "bm25+ss", "top_k": 3})  # auto: cosine, in the grid
    assert job_setting(auto).label == tried[0].label and len(settings_to_try(auto.auto, job_setting(auto))) == 4
    with pytest.raises(Exception, match="objective: give at least one"):
        _cfg(tmp_path, auto={**grid, "objective": []})
    with pytest.raises(Exception, match="auto.objective: cosent-distill rank pairs by their similarity scores"):
        _cfg(tmp_path, task="binary", auto=grid)


def test_the_jobs_own_setting_is_tried_first_and_once(tmp_path):
    from augsbert_ray.stages.auto import job_setting, settings_to_try

    grid = {"enabled": True, "teacher_recipes": [[4, 2e-5], [8, 5e-5]], "strategies": ["bm25"], "top_k": [3, 10],
            "calibration": ["none"]}
    cfg = _cfg(tmp_path, auto=grid, cross_encoder={"epochs": 8, "lr": 5e-5}, sampling={"strategy": "bm25", "top_k": 10})
    own = job_setting(cfg)
    assert own.label == "teacher 8x5e-05, bm25 top-10, calibration none"
    tried = settings_to_try(cfg.auto, own)
    assert [s.label for s in tried] == [own.label, "teacher 4x2e-05, bm25 top-3, calibration none",
                                        "teacher 4x2e-05, bm25 top-10, calibration none",
                                        "teacher 8x5e-05, bm25 top-3, calibration none"]
    # Outside the grid it is one setting more; with gold_repeat searched it names its own count.
    cfg = _cfg(tmp_path, auto={**grid, "gold_repeat": [1, 3]}, cross_encoder={"epochs": 4, "lr": 5e-5},
               sampling={"strategy": "bm25", "top_k": 10}, bi_encoder={"gold_repeat": 2})
    own = job_setting(cfg)
    assert own.label == "teacher 4x5e-05, bm25 top-10, calibration none, gold x2"
    assert own.apply(cfg).bi_encoder.gold_repeat == 2 and own.apply(cfg).cross_encoder.lr == 5e-5
    assert len(settings_to_try(cfg.auto, own)) == 1 + 8 and settings_to_try(cfg.auto, own)[0] == own


def test_a_pilots_training_set_is_the_students():
    from augsbert_ray.stages.student import student_training_set

    gold = pa.table({schema.SENTENCE1: ["a"], schema.SENTENCE2: ["b"], schema.LABEL: pa.array([1.0], pa.float32())})
    silver = pa.table({schema.SENTENCE1: ["c", "d"], schema.SENTENCE2: ["e", "f"],
                       schema.LABEL: pa.array([0.7, 0.2], pa.float32())})
    assert student_training_set(gold, silver, "regression").column(schema.LABEL).to_pylist() == \
        pytest.approx([1.0, 0.7, 0.2])
    assert student_training_set(gold, silver, "binary").column(schema.LABEL).to_pylist() == [1.0, 1.0, 0.0]
    assert student_training_set(None, silver, "regression").num_rows == 2  # target silver only
    # gold_repeat: each gold pair that many times, beside the silver or alone (the gold-only
    # reference counts gold as often as AugSBERT does)
    assert student_training_set(gold, silver, "regression", 3).column(schema.SENTENCE1).to_pylist() == \
        ["a", "a", "a", "c", "d"]
    assert student_training_set(gold, None, "regression", 3).num_rows == 3
    assert student_training_set(gold, None, "regression").num_rows == 1
    # Each row says whether the teacher labelled it (score distillation reads it; nothing guesses)
    mixed = student_training_set(gold, silver.append_column(schema.ORIGIN, pa.array(["bm25", "ss"])), "regression", 2)
    assert mixed.column_names == schema.TRAINING_COLUMNS
    assert schema.silver_flags(mixed).tolist() == [False, False, True, True]
    assert schema.silver_flags(student_training_set(gold, None, "regression")).tolist() == [False]
    assert schema.silver_flags(gold) is None and schema.training_columns(gold) == schema.PAIR_COLUMNS


def test_fold_pilots_hold_out_each_gold_pair_once_and_its_sentences_silver():
    from augsbert_ray.stages.pilot import fold_sets

    n = 10
    gold = pa.table({schema.SENTENCE1: [f"a{i}" for i in range(n)], schema.SENTENCE2: [f"b{i}" for i in range(n)],
                     schema.LABEL: pa.array([i / n for i in range(n)], pa.float32())})
    # silver: each gold pair itself (as BM25 would find it), and a pair of two other gold sentences
    silver = pa.table({schema.SENTENCE1: [f"a{i}" for i in range(n)] + [f"b{i}" for i in range(n)],
                       schema.SENTENCE2: [f"b{i}" for i in range(n)] + [f"a{(i + 1) % n}" for i in range(n)],
                       schema.LABEL: pa.array([0.5] * (2 * n), pa.float32())})
    sets, evals, held = fold_sets(gold, {"gold + silver": (silver, 2)}, "regression", True, 3, seed=7)
    held_s1 = [s for t in held for s in t.column(schema.SENTENCE1).to_pylist()]
    assert sorted(held_s1) == sorted(f"a{i}" for i in range(n))  # every gold pair held out exactly once
    assert [t.num_rows for t in held] in ([4, 3, 3], [3, 4, 3], [3, 3, 4])
    for f, out in enumerate(held):
        name, gold_name = f"gold + silver, fold {f + 1}", f"gold only, fold {f + 1}"
        assert evals[name] is out and evals[gold_name] is out
        unseen = set(out.column(schema.SENTENCE1).to_pylist()) | set(out.column(schema.SENTENCE2).to_pylist())
        train = sets[name]
        trained = set(train.column(schema.SENTENCE1).to_pylist()) | set(train.column(schema.SENTENCE2).to_pylist())
        assert not trained & unseen and not set(sets[gold_name].column(schema.SENTENCE1).to_pylist()) & unseen
        assert sets[gold_name].num_rows == n - out.num_rows
        kept = sum(1 for a, b in zip(silver.column(schema.SENTENCE1).to_pylist(),
                                     silver.column(schema.SENTENCE2).to_pylist()) if a not in unseen and b not in unseen)
        assert train.num_rows == 2 * (n - out.num_rows) + kept  # gold twice, then the silver left
    again = fold_sets(gold, {"gold + silver": (silver, 2)}, "regression", True, 3, seed=7)[2]
    assert all(a.equals(b) for a, b in zip(again, held))  # seeded
    # the gold-only pilots count gold as often as the job's gold-only student
    matched = fold_sets(gold, {"gold + silver": (silver, 2)}, "regression", True, 3, seed=7, gold_repeat=2)[0]
    assert [matched[f"gold only, fold {f + 1}"].num_rows for f in range(3)] == [2 * (n - t.num_rows) for t in held]
    with pytest.raises(ConfigError, match="12 folds need at least 12 gold training pairs"):
        fold_sets(gold, {}, "regression", True, 12, seed=7)


@pytest.mark.parametrize("low,high,helps,words", [(0.4, 3.0, True, "the silver labels help"),
                                                 (-3.0, -0.1, False, "the silver labels do not help"),
                                                 (-1.2, 2.1, None, "within what dev can tell apart")])
def test_the_pilot_predicts_only_outside_dev_noise(low, high, helps, words):
    from augsbert_ray.stages.pilot import pilot_verdict

    gain = {"difference": (low + high) / 2, "low": low, "high": high, "confidence": 0.9, "resamples": 1000}
    got, verdict = pilot_verdict(gain)
    assert got is helps and words in verdict and "90% interval" in verdict
    assert pilot_verdict(None) == (None, "no prediction (a pilot has no score)")
