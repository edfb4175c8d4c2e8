"""benchmarks/strong_teacher.py: its default job is the Table 5 setting, and what it reports of a
run (scores, the target's verdict) is read from the run's metrics as the README quotes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_benchmark

from augsbert_ray.config import load_job

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def strong():
    return load_benchmark("strong_teacher")


def _metrics(gold_test: float, aug_test: float) -> dict:
    split = lambda dev, test: {"dev": {"spearman": dev}, "test": {"spearman": test}}  # noqa: E731
    return {"primary_metric": "spearman",
            "scores": {"gold_only": split(89.0, gold_test), "augsbert": split(89.5, aug_test),
                       "cross_encoder": split(91.0, 90.0), "zero_shot": split(86.7, 82.0)},
            "sampling": {"silver": 18614}, "shipped": {"shipped": "augsbert"},
            "teacher_check": {"gap": 2.0}, "stage_seconds": {"cross_encoder": 3500.0, "augsbert": 600.0}}


def test_the_default_job_is_the_mpnet_teacher_over_all_gold_pairs(strong):
    cfg = load_job(REPO / strong.JOB, ["bi_encoder.seed=43"])
    assert "all-mpnet-base-v2" in cfg.cross_encoder.model
    assert "train" not in cfg.data.subsample and cfg.bi_encoder.num_layers is None  # all pairs, all 6 layers
    assert cfg.bi_encoder.seed == 43 and cfg.seed == 42  # one teacher, the student's seed varied
    assert cfg.bi_encoder.gold_repeat == 3  # led gold once on dev and test, three seeds


def test_a_row_reads_every_model_and_the_interval(strong):
    gain = {"difference": 1.3, "low": 0.8, "high": 1.8}
    row = strong.row_of(_metrics(85.1, 86.4), 43, gain)
    assert row["scores"]["cross_encoder"] == {"dev": 91.0, "test": 90.0}
    assert row["scores"]["augsbert"]["test"] == 86.4 and row["silver"] == 18614
    assert row["teacher_check_gap"] == 2.0 and row["test_gain"] is gain
    line = strong.table([row])[2]
    assert line.startswith("| 43 | 86.70 / 82.00 | 89.00 / 85.10 | 91.00 / 90.00 | 89.50 / 86.40 | +1.30 (+0.80 to +1.80)")


@pytest.mark.parametrize("diffs, met", [([1.3, 1.0], True), ([1.3, 0.9], False), ([-0.5], False)])
def test_the_target_holds_only_on_every_seed(strong, diffs, met):
    rows = [{"test_gain": {"difference": d}} for d in diffs]
    assert strong.verdict(rows, 1.0).endswith("is met." if met else "is not met.")


def test_the_jobs_own_seed_reuses_a_plain_run_of_the_job(strong):
    assert strong.student_seed(["run_dir=/r"], 42, 42) == ["run_dir=/r"]
    assert strong.student_seed(["run_dir=/r"], 43, 42) == ["run_dir=/r", "bi_encoder.seed=43"]


def _run_with_predictions(root: Path, model: str, fp: str, preds: dict) -> dict:
    """A run's metrics naming one evaluation stage, with its predictions saved as the engine saves them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / "stages" / f"eval_{model}" / fp[:16]
    folder.mkdir(parents=True)
    splits = [s for s, (p, _) in preds.items() for _ in p]
    pq.write_table(pa.table({"split": splits, "prediction": [x for p, _ in preds.values() for x in p],
                             "label": [x for _, labels in preds.values() for x in labels]}),
                   folder / "predictions.parquet")
    return {"run_dir": str(root), "task": "regression", "stages": [{"name": f"eval_{model}", "fingerprint": fp}]}


def test_augsbert_is_compared_with_another_settings_gold_only_student_on_dev_and_test(strong, tmp_path, monkeypatch):
    from scipy.stats import spearmanr

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as when run as a script: it reads through pilot_check

    labels = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 2.5, 1.5]
    aug = {"dev": ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.35, 0.25], labels),
           "test": ([0.1, 0.3, 0.2, 0.4, 0.6, 0.5, 0.35, 0.25], labels)}
    gold = {"dev": ([0.2, 0.1, 0.3, 0.5, 0.4, 0.6, 0.25, 0.35], labels),
            "test": ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.35, 0.25], labels)}
    m = _run_with_predictions(tmp_path / "a", "augsbert", "a" * 32, aug)
    base = _run_with_predictions(tmp_path / "b", "gold_only", "b" * 32, gold)
    gain = strong.gain_over(m, base, seed=1)
    for split in ("dev", "test"):
        expected = 100 * (spearmanr(aug[split][0], labels)[0] - spearmanr(gold[split][0], labels)[0])
        assert gain[split]["difference"] == pytest.approx(expected)
        assert gain[split]["low"] <= gain[split]["difference"] <= gain[split]["high"]
    assert gain["dev"]["difference"] > 0 > gain["test"]["difference"]  # each split read from its own rows
    row = {"seed": 42, "baseline_gain": gain, "baseline_scores": {"dev": 89.37, "test": 85.13}}
    lines = strong.baseline_table([row], ["bi_encoder.objective=cosine"])
    assert "`bi_encoder.objective=cosine`" in lines[0]
    assert lines[-1].startswith(f"| 42 | 89.37 / 85.13 | {gain['dev']['difference']:+.2f} (")
