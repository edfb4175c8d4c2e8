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

    # BM25's pool thinned to gold's class balance: the same candidates and labels as BM25's,
    # then every positive and gold's ratio of negatives. Only the candidates and labels are redone.
    import numpy as np
    import pyarrow.parquet as pq

    from augsbert_ray import schema

    kde = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"strategy": "bm25-kde"})})
    again = run_job(kde, until="silver")
    assert {"cross_encoder", "gold_only"} <= set(again.stages_reused)
    assert not again.stage("candidates").reused and not again.stage("silver").reused
    rd = cfg.resolved_run_dir
    key = [schema.SENTENCE1, schema.SENTENCE2]

    def rows(stage, name, fp):
        t = pq.read_table(rd / "stages" / stage / fp[:16] / name).to_pandas()
        return t.sort_values(key).reset_index(drop=True)

    bm25_silver = rows("silver", "silver.parquet", metrics.stage("silver").fingerprint)
    pool = rows("silver", "silver_pool.parquet", again.stage("silver").fingerprint)
    assert pool[key].equals(bm25_silver[key])
    assert np.allclose(pool[schema.LABEL], bm25_silver[schema.LABEL], atol=1e-6)  # the same teacher's labels
    kept = rows("silver", "silver.parquet", again.stage("silver").fingerprint)
    positives = int((pool[schema.LABEL] >= 0.5).sum())
    gold_pos = int(pq.read_table(rd / "stages" / "gold" / again.stage("gold").fingerprint[:16] / "train.parquet")
                   .column(schema.LABEL).to_numpy().sum())
    gold_neg = gold.train - gold_pos
    assert int((kept[schema.LABEL] >= 0.5).sum()) == positives  # every positive
    assert int((kept[schema.LABEL] < 0.5).sum()) == min(len(pool) - positives, round(positives * gold_neg / gold_pos))
    assert again.result("silver").silver == len(kept)
