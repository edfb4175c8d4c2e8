"""Domain adaptation on tiny data: a cross-encoder trained on source gold (STSb format)
labels target pairs (MRPC format, or an unlabelled CSV); the bi-encoder trains on them and
every model is scored on the labelled target test set."""

from __future__ import annotations

import csv

import numpy as np
import pyarrow.parquet as pq
import pytest

from augsbert_ray import schema
from augsbert_ray.config import validate_tree
from augsbert_ray.loaders import load_pairs
from augsbert_ray.pipeline import run_job
from augsbert_ray.progress.messages import lines_to
from augsbert_ray.sources import DataSource


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    """One run directory for the module's jobs: they share the source side (the same source
    gold and settings), so the teacher and the gold-only model train once."""
    return tmp_path_factory.mktemp("da") / "run"


def _job(run_dir, tiny_stsb, tiny_model, target: dict) -> dict:
    return validate_tree({
        "name": "tiny-da",
        "run_dir": str(run_dir),
        "data": {s: {"format": "stsb", "path": str(p)} for s, p in tiny_stsb.items()},
        "cross_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "bi_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "labeling": {"block_size": 16, "micro_batch_size": 8},
        "evaluation": {"batch_size": 16},
        "target": target,
    })


def _unlabelled_csv(path, mrpc_file) -> str:
    rows = [line.split("\t") for line in mrpc_file.read_text(encoding="utf-8-sig").splitlines()[1:]]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["question1", "question2"])
        for r in rows:
            w.writerow([r[3], r[4]])
        w.writerow([rows[0][3], rows[0][3]])  # a self-pair
        w.writerow([rows[1][4], rows[1][3]])  # a repeat, in the other order
    return str(path)


def test_unlabelled_pairs_load_with_nan_labels(tmp_path):
    from conftest import write_mrpc

    path = _unlabelled_csv(tmp_path / "t.csv", write_mrpc(tmp_path / "m.txt", 5, 1))
    src = DataSource(format="csv", path=path, columns={"sentence1": "question1", "sentence2": "question2", "label": None})
    res = load_pairs(src, "target_pairs")
    assert res.table.num_rows == 7 and np.isnan(res.table.column(schema.LABEL).to_numpy()).all()
    with pytest.raises(Exception, match="gold pairs need labels"):
        validate_tree({"name": "x", "data": {"train": src.model_dump(), "dev": src.model_dump(), "test": src.model_dump()}})


@pytest.mark.slow
def test_labelled_target_pairs_binary_target(tmp_path, tiny_stsb, _tiny_model_master, shared_run, ray_local):
    tiny_model = str(_tiny_model_master)
    from conftest import write_mrpc

    pairs, test = write_mrpc(tmp_path / "train.txt", 40, 7), write_mrpc(tmp_path / "test.txt", 30, 8)
    cfg = _job(shared_run, tiny_stsb, tiny_model, {
        "pairs": {"format": "mrpc", "path": str(pairs)}, "test": {"format": "mrpc", "path": str(test)}, "task": "binary"})
    lines = []
    with lines_to(lines.append):
        m = run_job(cfg).to_dict()
    rd = cfg.resolved_run_dir
    assert m["target"]["task"] == "binary" and m["target"]["metric"] == "auc_0.05"
    for key in ("zero_shot", "gold_only", "cross_encoder", "target_gold", "augsbert"):
        auc = m["scores"][key]["target_test"]["auc_0.05"]
        assert 0 <= auc <= 100 and m["scores"][key]["target_test"]["pairs"] == 30
        assert "f1" not in m["scores"][key]["target_test"]  # no target dev set: no threshold to apply
    assert m["scores"]["augsbert"]["test"]["spearman"] is not None  # the source test is scored too
    silver = pq.read_table(rd / "silver.parquet")
    c = m["target"]["candidates"]
    # every distinct target pair, labelled by the teacher
    assert silver.num_rows == m["sampling"]["silver"] == 40 - c["self_pairs_left_out"] - c["repeats_left_out"] > 30
    labels = silver.column(schema.LABEL).to_numpy()
    assert ((labels > 0.01) & (labels < 0.99)).any()  # teacher scores, not the target's gold 0/1
    # AugSBERT trained on target silver only (the default): no source gold in its training set.
    assert m["sampling"]["strategy"] == "target pairs"
    summary = (rd / "summary.md").read_text()
    assert "## Domain adaptation (target test set)" in summary and "Upper bound: bi-encoder on target gold" in summary
    assert any("[target_gold] target test auc_0.05" in line for line in lines)


@pytest.mark.slow
def test_unlabelled_target_pairs_mixed_with_source_gold(tmp_path, tiny_stsb, _tiny_model_master, shared_run,
                                                         ray_local):
    tiny_model = str(_tiny_model_master)
    from conftest import write_mrpc

    path = _unlabelled_csv(tmp_path / "target.csv", write_mrpc(tmp_path / "m.txt", 30, 3))
    cfg = _job(shared_run, tiny_stsb, tiny_model, {
        "pairs": {"format": "csv", "path": path,
                  "columns": {"sentence1": "question1", "sentence2": "question2", "label": None}},
        "test": {"format": "stsb", "path": str(tiny_stsb["test"])}, "mix_source_gold": True})
    m = run_job(cfg).to_dict()
    assert "target_gold" not in m["scores"] and m["target"]["data"]["pairs"]["labelled"] is False
    assert m["target"]["candidates"] == {"target_pairs": 32, "self_pairs_left_out": 1, "repeats_left_out": 1}
    assert m["sampling"]["silver"] == 30
    result = next(s for s in m["stages"] if s["name"] == "augsbert")["result"]
    assert result["train_pairs"] == 30 + m["data"]["train"]  # target silver + source gold
    assert "No upper bound" in (cfg.resolved_run_dir / "summary.md").read_text()
    assert -100 <= m["scores"]["augsbert"]["target_test"]["spearman"] <= 100  # a regression target


@pytest.mark.slow
def test_corpus_mode_samples_pairs_from_target_sentences(tmp_path, tiny_stsb, _tiny_model_master, shared_run,
                                                          ray_local):
    tiny_model = str(_tiny_model_master)
    from conftest import write_mrpc

    corpus_file, test = write_mrpc(tmp_path / "train.txt", 40, 7), write_mrpc(tmp_path / "test.txt", 30, 8)
    cfg = _job(shared_run, tiny_stsb, tiny_model, {
        "corpus": {"path": str(corpus_file), "format": "tsv", "column": "#1 String"},
        "test": {"format": "mrpc", "path": str(test)}, "task": "binary"})
    m = run_job(cfg).to_dict()
    rd = cfg.resolved_run_dir
    lines = m["target"]["candidates"]["corpus_lines"]
    assert lines["lines"] == 40 and lines["ok"] + lines["truncated"] == lines["distinct"] + lines["duplicates"]
    sentences = pq.read_table(rd / "sentences.parquet").column(schema.TEXT).to_pylist()
    corpus_rows = [r.split("\t") for r in corpus_file.read_text(encoding="utf-8-sig").splitlines()[1:]]
    assert sentences == list(dict.fromkeys(r[3] for r in corpus_rows))  # the corpus column, deduplicated
    # BM25 pairs of corpus sentences, labelled by the source-trained teacher.
    assert m["sampling"]["strategy"] == "bm25" and m["sampling"]["sentences"] == len(sentences)
    silver = pq.read_table(rd / "silver.parquet")
    assert silver.num_rows == m["sampling"]["silver"] > 0
    assert set(silver.column(schema.SENTENCE1).to_pylist()) | set(silver.column(schema.SENTENCE2).to_pylist()) \
        <= set(sentences)
    assert 0 <= m["scores"]["augsbert"]["target_test"]["auc_0.05"] <= 100
    assert "target_gold" not in m["scores"]  # a corpus has no labels: no upper bound
    # A re-run reuses the corpus's candidates (its files are unchanged).
    m2 = run_job(cfg).to_dict()
    assert "candidates" in m2["stages_reused"] and m2["sampling"]["silver"] == m["sampling"]["silver"]
