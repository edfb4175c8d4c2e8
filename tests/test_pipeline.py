"""The whole job on Ray with a tiny random BERT and synthetic STSb-format data."""

import json

import numpy as np
import pytest

from augsbert_ray import schema
from augsbert_ray.candidates.pairs import gold_pair_keys, pair_keys, unique_sentences
from augsbert_ray.config import validate_tree
from augsbert_ray.pipeline import run_job

MODELS = ("zero_shot", "gold_only", "cross_encoder", "augsbert")


def tiny_job(tiny_stsb, tiny_model, run_dir, **sampling):
    return validate_tree(
        {
            "name": "tiny",
            "run_dir": str(run_dir),
            "data": {s: {"format": "stsb", "path": str(p)} for s, p in tiny_stsb.items()},
            "cross_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
            "bi_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
            "sampling": {"strategy": "bm25", "top_k": 2, "query_batch_size": 16, **sampling},
            "labeling": {"block_size": 32, "micro_batch_size": 8},
            "evaluation": {"batch_size": 16},
        }
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, _tiny_model_master, ray_local):
    from conftest import write_stsb

    root = tmp_path_factory.mktemp("pipeline")
    stsb = {s: write_stsb(root / f"sts-{s}.csv", n, seed) for s, n, seed in [("train", 48, 1), ("dev", 24, 2), ("test", 24, 3)]}
    cfg = tiny_job(stsb, str(_tiny_model_master), root / "run")
    lines = []
    metrics = run_job(cfg, log=lines.append)
    return cfg, stsb, metrics, lines


def test_reports_all_four_models(finished_run):
    cfg, _, metrics, lines = finished_run
    for key in MODELS:
        for split in ("dev", "test"):
            value = metrics["scores"][key][split]["spearman"]
            assert np.isfinite(value) and -100 <= value <= 100
    assert metrics["data"] == {"train": 48, "dev": 24, "test": 24, "rows_read": {"train": 48, "dev": 24, "test": 24},
                               "skipped_rows": 0, "subsample": {}, "dev_carved": None}
    assert metrics["teacher_check"]["gap"] == pytest.approx(
        metrics["scores"]["cross_encoder"]["dev"]["spearman"] - metrics["scores"]["gold_only"]["dev"]["spearman"]
    )
    assert any("[silver] labelled" in line for line in lines), "progress is logged"


def test_run_directory_artifacts(finished_run):
    cfg, _, metrics, _ = finished_run
    rd = cfg.resolved_run_dir
    for name in ["config.yaml", "gold/train.parquet", "gold/dev.parquet", "gold/test.parquet", "sentences.parquet",
                 "candidates.parquet", "silver.parquet", "metrics.json", "summary.md"]:
        assert (rd / name).exists(), name
    assert json.loads((rd / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    summary = (rd / "summary.md").read_text()
    assert "AugSBERT bi-encoder" in summary and "Cross-encoder" in summary
    # observability: each stage's rate and the cluster it ran on
    assert "pairs labelled/s" in summary and "training pairs/s" in summary and "Ray cluster: 1 node(s), 2 CPUs" in summary
    assert metrics["cluster"]["nodes"] == 1 and set(metrics["stage_throughput"]) >= {"silver", "candidates", "augsbert"}


def test_silver_pairs_follow_the_rules(finished_run):
    import pyarrow.parquet as pq

    cfg, _, metrics, _ = finished_run
    rd = cfg.resolved_run_dir
    cands, silver = pq.read_table(rd / "candidates.parquet"), pq.read_table(rd / "silver.parquet")
    gold = pq.read_table(rd / "gold/train.parquet")
    assert silver.schema == schema.SILVER_SCHEMA and silver.num_rows == cands.num_rows > 0
    assert metrics["sampling"]["silver"] == silver.num_rows
    id1, id2 = silver.column(schema.ID1).to_numpy(), silver.column(schema.ID2).to_numpy()
    assert (id1 < id2).all()
    sentences = unique_sentences(gold)
    keys = pair_keys(id1, id2, sentences.num_rows)
    assert len(np.unique(keys)) == len(keys)
    assert not np.isin(keys, gold_pair_keys(gold, sentences)).any()
    labels = silver.column(schema.LABEL).to_numpy()
    assert ((labels >= 0) & (labels <= 1)).all()


def test_models_load_with_sentence_transformers(finished_run):
    from sentence_transformers import CrossEncoder, SentenceTransformer

    rd = finished_run[0].resolved_run_dir
    for name in ("bi-encoder-augsbert", "bi-encoder-gold-only"):
        emb = SentenceTransformer(str(rd / "models" / name), device="cpu").encode(["A man is eating."])
        assert emb.shape == (1, 32)
    scores = CrossEncoder(str(rd / "models" / "cross-encoder"), device="cpu").predict([("A man.", "A dog.")])
    assert 0 <= float(scores[0]) <= 1


def test_rerun_skips_completed_stages_and_redoes_changed_ones(finished_run):
    cfg, stsb, metrics, _ = finished_run
    lines = []
    again = run_job(cfg, log=lines.append)
    assert sorted(again["stages_reused"]) == sorted(["cross_encoder", "zero_shot", "gold_only", "candidates", "silver", "augsbert"])
    assert again["scores"] == metrics["scores"]

    changed = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"top_k": 1})})
    third = run_job(changed, log=lines.append)
    assert sorted(third["stages_reused"]) == ["cross_encoder", "gold_only", "zero_shot"]
    assert third["sampling"]["candidates"] < metrics["sampling"]["candidates"]

    # Another bi-encoder seed: BM25 candidates and their labels do not depend on it.
    reseeded = changed.model_copy(update={"bi_encoder": changed.bi_encoder.model_copy(update={"seed": 77})})
    fourth = run_job(reseeded, log=lines.append)
    assert sorted(fourth["stages_reused"]) == ["candidates", "cross_encoder", "silver", "zero_shot"]
    # and they were trained again, not restored from the earlier seed's Ray Train checkpoints
    assert fourth["scores"]["gold_only"] != third["scores"]["gold_only"]
    assert fourth["scores"]["augsbert"] != third["scores"]["augsbert"]
    train_runs = sorted(p.name for p in (cfg.resolved_run_dir / "ray_train").iterdir())
    assert len(train_runs) == 3 and [r.rsplit("-", 1)[0] for r in train_runs] == [
        "bi-encoder-augsbert", "bi-encoder-gold-only", "cross-encoder"]  # earlier fingerprints' runs removed

    # A stage whose marker is there but whose output is gone is redone (and only it).
    (cfg.resolved_run_dir / "models" / "bi-encoder-augsbert" / "model.safetensors").unlink()
    lines.clear()
    fifth = run_job(reseeded, log=lines.append)
    assert sorted(fifth["stages_reused"]) == ["candidates", "cross_encoder", "gold_only", "silver", "zero_shot"]
    assert any("[augsbert] completed earlier, but models/bi-encoder-augsbert is missing or changed" in line
               for line in lines)
    assert "(in the training loop, fp32)" in fifth["stage_throughput"]["augsbert"]

    # Training in bf16 retrains every encoder, and the teacher's labels with them; the
    # candidates (BM25) and the untrained zero-shot model stay.
    bf16 = reseeded.model_copy(update={"training": reseeded.training.model_copy(update={"precision": "bf16"})})
    sixth = run_job(bf16, log=lines.append)
    assert sorted(sixth["stages_reused"]) == ["candidates", "zero_shot"]
    assert all("(in the training loop, bf16)" in sixth["stage_throughput"][key]
               for key in ("cross_encoder", "gold_only", "augsbert")), sixth["stage_throughput"]
    assert all(np.isfinite(sixth["scores"]["augsbert"][split]["spearman"]) for split in ("dev", "test"))


def test_fresh_redoes_completed_stages(tmp_path):
    from augsbert_ray.pipeline import Job
    from augsbert_ray.rundir import RunDir

    cfg = validate_tree({"name": "x", "data": {s: {"format": "stsb", "path": f"{s}.csv"} for s in ("train", "dev", "test")}})
    rd = RunDir(tmp_path / "run")
    calls = []
    Job(cfg, rd, print).stage("s", "fp", lambda: calls.append(1) or {"n": 1})
    Job(cfg, rd, print).stage("s", "fp", lambda: calls.append(2) or {"n": 2})
    assert calls == [1]  # resumed by default
    done = Job(cfg, rd, print, fresh=True).stage("s", "fp", lambda: calls.append(3) or {"n": 3})
    assert calls == [1, 3] and done.result["n"] == 3


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
    metrics = run_job(cfg, log=lambda line: None)
    assert metrics["primary_metric"] == "f1" and metrics["bi_encoder_objective"] == "softmax"
    assert metrics["data"]["train"] == 48 and metrics["data"]["dev"] == 12  # 20% of 60 carved off
    assert "12 of 60 training pairs" in metrics["data"]["dev_carved"]
    for key in MODELS:
        s = metrics["scores"][key]
        assert s["dev"]["threshold"] == s["test"]["threshold"]  # chosen on dev, applied to test
        assert 0 <= s["test"]["f1"] <= 100 and 0 <= s["test"]["accuracy"] <= 100
        assert 0 <= s["test"]["auc_0.05"] <= 100  # AUC(0.05), no threshold needed
    assert set(metrics["baselines"]) == {"jaccard", "majority"}
    assert "test AUC(0.05)" in (cfg.resolved_run_dir / "summary.md").read_text()
    assert (cfg.resolved_run_dir / "silver_density.png").stat().st_size > 1000


def test_teacher_check_stops_when_asked(tmp_path):
    from augsbert_ray.errors import TeacherCheckError
    from augsbert_ray.pipeline import Job, Stage
    from augsbert_ray.rundir import RunDir

    cfg = tiny_job({s: tmp_path / f"{s}.csv" for s in ("train", "dev", "test")}, "m", tmp_path / "run")
    weak, strong = Stage({"scores": {"dev": {"spearman": 70.0}}}, "a"), Stage({"scores": {"dev": {"spearman": 80.0}}}, "b")
    lines = []
    job = Job(cfg, RunDir(tmp_path / "run"), lines.append)
    job.teacher_check(weak, strong)
    assert "WARNING" in lines[-1] and job.results["teacher_check"]["gap"] == -10.0
    job.teacher_check(strong, weak)
    assert "leads" in lines[-1]
    stopping = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update={"teacher_check": "stop"})})
    with pytest.raises(TeacherCheckError, match="not better"):
        Job(stopping, RunDir(tmp_path / "run2"), lines.append).teacher_check(weak, strong)


def test_carve_dev_is_seeded_and_disjoint():
    import pyarrow as pa

    from augsbert_ray.pipeline import carve_dev

    t = pa.table({"sentence1": [f"s{i}" for i in range(50)], "split": ["train"] * 50})
    train, dev = carve_dev(t, 0.2, seed=1)
    assert dev.num_rows == 10 and train.num_rows == 40
    assert set(dev.column("split").to_pylist()) == {"dev"}
    assert not set(dev.column("sentence1").to_pylist()) & set(train.column("sentence1").to_pylist())
    assert carve_dev(t, 0.2, seed=1)[1].equals(dev) and not carve_dev(t, 0.2, seed=2)[1].equals(dev)


def test_gold_fingerprint_ignores_the_path_data_was_read_from(tmp_path):
    import shutil

    from augsbert_ray.pipeline import Job
    from augsbert_ray.rundir import RunDir
    from conftest import write_stsb

    first = {s: write_stsb(tmp_path / f"sts-{s}.csv", 20, i) for i, s in enumerate(("train", "dev", "test"))}
    (tmp_path / "copy").mkdir()
    second = {s: shutil.copy(p, tmp_path / "copy" / p.name) for s, p in first.items()}
    fps = []
    for files in (first, second):
        job = Job(tiny_job(files, "m", tmp_path / "run"), RunDir(tmp_path / "run"), lambda line: None)
        job.load_gold()
        fps.append(job.gold_fp)
    assert fps[0] == fps[1]
    write_stsb(second["train"], 20, 99)  # different content: a different fingerprint
    job = Job(tiny_job(second, "m", tmp_path / "run"), RunDir(tmp_path / "run"), lambda line: None)
    job.load_gold()
    assert job.gold_fp["train"] != fps[0]["train"] and job.gold_fp["dev"] == fps[0]["dev"]


@pytest.mark.slow
def test_seed_search_decides_every_encoder_and_works_with_semantic_search(tmp_path, tiny_model, ray_local):
    """Seed search is a config switch: both encoders searched, SS sampling on the searched gold-only model."""
    from conftest import write_stsb

    stsb = {s: write_stsb(tmp_path / f"sts-{s}.csv", n, seed) for s, n, seed in [("train", 32, 1), ("dev", 16, 2), ("test", 16, 3)]}
    cfg = tiny_job(stsb, tiny_model, tmp_path / "run", strategy="ss")
    cfg = validate_tree({**json.loads(cfg.model_dump_json()),
                         "seed_search": {"enabled": True, "targets": ["bi_encoder", "cross_encoder"], "seeds": [3, 4],
                                         "keep": 1, "prune_at": 0.5}})
    metrics = run_job(cfg, log=lambda line: None)
    searched = metrics["seed_search"]
    assert sorted(searched) == ["augsbert", "cross_encoder", "gold_only"]
    for stage, rec in searched.items():
        assert rec["seeds"] == [3, 4] and rec["chosen_seed"] in (3, 4)
        finished = [t for t in rec["trials"] if t["steps"] == rec["total_steps"]]
        assert len(finished) == 1 and finished[0]["seed"] == rec["chosen_seed"]
        # the job's own evaluation of the chosen model reproduces the score the search chose it by
        assert metrics["scores"][stage]["dev"]["spearman"] == pytest.approx(rec["chosen_dev"], abs=1e-3)
    summary = (cfg.resolved_run_dir / "summary.md").read_text()
    assert summary.count("Seed search for") == 3 and "training steps against" in summary
