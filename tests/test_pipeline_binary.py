"""A binary task (MRPC format) through the whole job on Ray with a tiny random BERT: its own
file so that a second test worker can run it beside tests/test_pipeline.py."""

import pytest

from augsbert_ray.config import validate_tree
from augsbert_ray.pipeline import run_job
from test_pipeline import MODELS


@pytest.mark.timeout(600)
def test_binary_task_end_to_end(tmp_path, tiny_model, ray_local):
    from conftest import write_mrpc

    train, test = write_mrpc(tmp_path / "train.txt", 60, 4), write_mrpc(tmp_path / "test.txt", 30, 5)
    cfg = validate_tree(
        {
            "name": "tiny-binary",
            "task": "binary",
            "run_dir": str(tmp_path / "run"),
            "data": {"train": {"format": "mrpc", "path": str(train)}, "dev": None, "dev_fraction": 0.2,
                     "test": {"format": "mrpc", "path": str(test)}},
            "cross_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8},
            "bi_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8},
            "sampling": {"strategy": "bm25", "top_k": 2},
            "labeling": {"block_size": 32, "micro_batch_size": 8},
        }
    )
    metrics = run_job(cfg)
    assert metrics.primary_metric == "f1" and metrics.bi_encoder_objective == "softmax"
    gold = metrics.result("gold")
    assert gold.train == 48 and gold.dev == 12  # 20% of 60 carved off
    assert "12 of 60 training pairs" in gold.dev_carved
    for key in MODELS:
        s = metrics.scores[key]
        assert s["dev"]["threshold"] == s["test"]["threshold"]  # chosen on dev, applied to test
        assert 0 <= s["test"]["f1"] <= 100 and 0 <= s["test"]["accuracy"] <= 100
        assert 0 <= s["test"]["auc_0.05"] <= 100  # AUC(0.05), no threshold needed
    assert set(metrics.baselines) == {"jaccard", "majority"}
    assert "test AUC(0.05)" in (cfg.resolved_run_dir / "summary.md").read_text()
    assert (cfg.resolved_run_dir / "silver_density.png").stat().st_size > 1000
