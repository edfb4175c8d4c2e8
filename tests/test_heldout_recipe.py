"""benchmarks/heldout_recipe.py: its overrides make a valid job of each genre, and the share of the
gap it reports is the one the README quotes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import load_benchmark

from augsbert_ray.config import load_job

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def heldout():
    return load_benchmark("heldout_recipe")


def test_gap_closed_is_the_share_of_the_teacher_lead(heldout):
    # the main job's run at gold x3 (stsb_1k_student2_gr.md): 72.05 against 60.82 for gold only, teacher 75.83
    assert heldout.gap_closed(75.83, 60.82, 72.05) == pytest.approx(74.82, abs=0.01)
    assert heldout.gap_closed(80.0, 70.0, 65.0) == pytest.approx(-50.0)
    assert math.isnan(heldout.gap_closed(70.0, 70.0, 72.0))  # no lead: no gap to close
    assert math.isnan(heldout.gap_closed(60.0, 70.0, 72.0))


@pytest.mark.parametrize("task", ["captions", "news", "forums"])
def test_each_genre_is_a_valid_job_on_that_genre_alone(heldout, task):
    cfg = load_job(REPO / heldout.JOB, [*heldout.task_overrides(task), "bi_encoder.objective=cosent"])
    assert [cfg.data.train.genres, cfg.data.dev.genres, cfg.data.test.genres] == [[task]] * 3
    assert cfg.bi_encoder.objective == "cosent"


def test_the_stsb_task_is_the_job_as_it_is(heldout):
    # the data the recipe was chosen on: every genre, so no genre filter
    assert heldout.task_overrides("stsb") == []
    cfg = load_job(REPO / heldout.JOB, heldout.task_overrides("stsb"))
    assert [cfg.data.train.genres, cfg.data.dev.genres, cfg.data.test.genres] == [None] * 3


def test_a_variant_is_a_name_and_its_job_overrides(heldout):
    assert heldout.parse_variant("isotonic:labeling.calibration=isotonic,bi_encoder.gold_repeat=5") == (
        "isotonic", ["labeling.calibration=isotonic", "bi_encoder.gold_repeat=5"])
    assert heldout.parse_variant("job:") == ("job", [])
    for bad in ("isotonic", ":labeling.calibration=isotonic", "iso:labeling.calibration"):
        with pytest.raises(ValueError, match="expected NAME:KEY=VALUE"):
            heldout.parse_variant(bad)
    name, overrides = heldout.parse_variant("iso:labeling.calibration=isotonic")
    assert load_job(REPO / heldout.JOB, overrides).labeling.calibration == "isotonic"


def test_rows_from_before_variants_are_named_by_their_objective(heldout):
    old = {"task": "news", "objective": "cosine", "seed": 1}
    new = {"task": "news", "variant": "isotonic", "objective": "auto", "seed": 1}
    assert [heldout.variant_of(r) for r in (old, new)] == ["cosine", "isotonic"]
    assert heldout._key(old) != heldout._key(new)  # a variant's run never replaces another's row
    assert heldout.ordered([new, old, {**old, "task": "stsb"}])[0]["task"] == "stsb"


def test_an_unknown_task_is_refused(heldout):
    with pytest.raises(ValueError, match="unknown task 'sick'"):
        heldout.task_overrides("sick")


def test_the_summary_names_the_worst_difference_per_task_and_objective(heldout):
    rows = [{"task": "news", "objective": "cosine", "gap_closed": 80.0, "augsbert_test": 71.0, "gold_only_test": 70.0},
            {"task": "news", "objective": "cosine", "gap_closed": 60.0, "augsbert_test": 69.5, "gold_only_test": 70.0}]
    assert heldout.summarise(rows) == ["- news, cosine: mean gap closed 70.0% over 2 seed(s); "
                                       "smallest AugSBERT - gold only on test -0.50"]


def test_earlier_results_are_merged_and_a_run_made_again_replaces_its_row(heldout, tmp_path):
    row = lambda task, seed, gap: {"task": task, "objective": "cosine", "seed": seed, "gap_closed": gap}  # noqa: E731
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text('{"rows": [%s, %s], "runs": {"news cosine seed 1": {}}}' % (
        json.dumps(row("news", 1, 69.8)), json.dumps(row("captions", 1, 81.8))))
    second.write_text('{"rows": [%s, %s]}' % (json.dumps(row("news", 2, 75.0)), json.dumps(row("news", 1, 70.0))))
    rows, raw = heldout.merged([first, second])
    assert [(r["task"], r["seed"], r["gap_closed"]) for r in rows] == [("captions", 1, 81.8), ("news", 2, 75.0),
                                                                       ("news", 1, 70.0)]
    assert [(r["task"], r["seed"]) for r in heldout.ordered(rows)] == [("captions", 1), ("news", 1), ("news", 2)]
    assert list(raw) == ["news cosine seed 1"]


def _fake_run(root: Path, name: str, fingerprint: str, labels, predictions) -> dict:
    """A finished run's metrics as far as the comparison reads them, with its predictions on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    stage = root / name / "stages" / "eval_augsbert" / fingerprint[:16]
    stage.mkdir(parents=True)
    splits = ["dev"] * (len(labels) // 2) + ["test"] * (len(labels) - len(labels) // 2)
    pq.write_table(pa.table({"split": splits, "label": labels, "prediction": predictions}),
                   stage / "predictions.parquet")
    return {"run_dir": str(root / name), "stages": [{"name": "eval_augsbert", "fingerprint": fingerprint}]}


def test_a_later_variant_is_compared_with_the_first_on_dev_and_test(heldout, tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as when the script runs: its siblings import

    rng = np.random.default_rng(0)
    labels = rng.random(80)
    base = _fake_run(tmp_path, "a", "1" * 64, labels, labels + rng.normal(0, 0.5, 80))
    better = _fake_run(tmp_path, "b", "2" * 64, labels, labels + rng.normal(0, 0.05, 80))
    rows = [{"task": "news", "variant": v, "objective": "auto", "seed": 1} for v in ("job", "gold10")]
    raw = {"news job seed 1": base, "news gold10 seed 1": better}
    d = heldout.paired_against(base, better)
    assert list(d) == ["dev", "test"]
    assert all(g["low"] > 0 for g in d.values())  # near-perfect against noisy: better beyond the noise
    lines = heldout.comparisons(rows, raw)
    assert len(lines) == 1 and lines[0].startswith("- news, seed 1, gold10 - job: dev +")
    # a run on other pairs cannot be compared pair by pair
    other = _fake_run(tmp_path, "c", "3" * 64, labels[::-1].copy(), labels)
    with pytest.raises(ValueError, match="not of the same pairs"):
        heldout.paired_against(base, other)
