"""The whole job on Ray with a tiny random BERT and synthetic STSb-format data."""

import json

import numpy as np
import pytest

from augsbert_ray import schema
from augsbert_ray.candidates.pairs import gold_pair_keys, pair_keys, unique_sentences
from augsbert_ray.config import validate_tree
from augsbert_ray.pipeline import run_job
from augsbert_ray.progress.messages import lines_to
from augsbert_ray.rundir import RunDir

MODELS = ("zero_shot", "gold_only", "cross_encoder", "augsbert")
ALWAYS = ("gold", "target", "auto", "teacher_check", "ship")  # stages that run every time (cheap checks and loading)


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
    with lines_to(lines.append):
        metrics = run_job(cfg)
    return cfg, stsb, metrics, lines


def _sha256(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(600)  # builds the module's finished run
def test_reports_all_four_models(finished_run):
    cfg, _, metrics, lines = finished_run
    for key in MODELS:
        for split in ("dev", "test"):
            value = metrics.score(key, split)
            assert np.isfinite(value) and -100 <= value <= 100
    gold = metrics.result("gold")
    assert (gold.train, gold.dev, gold.test, gold.rows_read, gold.skipped_rows, gold.subsample, gold.dev_carved) == (
        48, 24, 24, {"train": 48, "dev": 24, "test": 24}, 0, {}, None)
    assert set(gold.baselines) == {"jaccard"}  # the gold stage scores the word-overlap baseline itself
    assert metrics.result("teacher_check").gap == pytest.approx(
        metrics.score("cross_encoder", "dev") - metrics.score("gold_only", "dev"))
    assert any("[silver] labelled" in line for line in lines), "progress is logged"
    assert [s.name for s in metrics.stages] == [
        "gold", "cross_encoder", "eval_cross_encoder", "eval_zero_shot", "gold_only", "eval_gold_only",
        "teacher_check", "candidates", "silver", "augsbert", "eval_augsbert", "ship"]
    assert not metrics.stages_reused and metrics.complete


def test_run_directory_artifacts(finished_run):
    cfg, _, metrics, _ = finished_run
    rd = cfg.resolved_run_dir
    for name in ["config.yaml", "gold/train.parquet", "gold/dev.parquet", "gold/test.parquet", "sentences.parquet",
                 "candidates.parquet", "silver.parquet", "metrics.json", "summary.md"]:
        assert (rd / name).exists(), name
    assert json.loads((rd / "metrics.json").read_text()) == json.loads(json.dumps(metrics.to_dict(), default=str))
    summary = (rd / "summary.md").read_text()
    assert "AugSBERT bi-encoder" in summary and "Cross-encoder" in summary
    # observability: each stage's rate and the cluster it ran on
    assert "pairs labelled/s" in summary and "training pairs/s" in summary and "Ray cluster: 1 node(s), 2 CPUs" in summary
    assert metrics.cluster.nodes == 1 and set(metrics.stage_throughput) >= {"silver", "candidates", "augsbert"}
    # training.precision's default, auto, resolves on this machine's CPU
    from augsbert_ray.training.loop import resolve_training_precision
    assert f"(in the training loop, {resolve_training_precision('auto', 'cpu')})" in metrics.stage_throughput["augsbert"]
    # A published model is the stage's own, linked; its training checkpoints are gone once it is done.
    stage = metrics.stage("augsbert")
    folder = rd / "stages" / "augsbert" / stage.fingerprint[:16]
    assert (folder / "done.json").exists() and not (folder / "ray").exists()
    assert _sha256(folder / "model" / "model.safetensors") == _sha256(rd / "models/bi-encoder-augsbert/model.safetensors")


def test_silver_pairs_follow_the_rules(finished_run):
    import pyarrow.parquet as pq

    cfg, _, metrics, _ = finished_run
    rd = cfg.resolved_run_dir
    cands, silver = pq.read_table(rd / "candidates.parquet"), pq.read_table(rd / "silver.parquet")
    gold = pq.read_table(rd / "gold/train.parquet")
    assert silver.schema == schema.SILVER_SCHEMA and silver.num_rows == cands.num_rows > 0
    assert metrics.result("silver").silver == silver.num_rows
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
    assert_cards(finished_run[0], finished_run[2])


def assert_cards(cfg, metrics) -> None:
    """Every published model's card names its base model and holds the run's own scores."""
    rd = cfg.resolved_run_dir
    shipped = "AugSBERT" if metrics.result("ship").shipped == "augsbert" else "gold-only"
    for folder, model in (("cross-encoder", "cross_encoder"), ("bi-encoder-gold-only", "gold_only"),
                          ("bi-encoder-augsbert", "augsbert"), ("bi-encoder", metrics.result("ship").shipped)):
        card = (rd / "models" / folder / "README.md").read_text()
        base = cfg.cross_encoder.model if model == "cross_encoder" else cfg.bi_encoder.model
        assert card.startswith("---\n") and f"**Base model:** `{base}`" in card, folder
        for split in ("dev", "test"):
            assert f"**{metrics.score(model, split):.2f}**" in card, (folder, split)
        assert f"{metrics.score('zero_shot', 'test'):.2f}" in card and f"is the {shipped} bi-encoder" in card, folder


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_python_api_runs_the_job_and_labels_pairs_as_the_silver_stage_did(finished_run, tmp_path):
    """``augsbert_ray.run`` on a finished job reuses every stage (Ray is not needed), and
    ``augsbert_ray.label`` scores the job's candidates with its teacher as the silver stage did."""
    import pyarrow.parquet as pq

    import augsbert_ray

    cfg, _, metrics, _ = finished_run
    again = augsbert_ray.run(cfg)
    assert again.scores == metrics.scores and again.cluster is None
    rd = cfg.resolved_run_dir
    summary = augsbert_ray.label(str(rd / "models" / "cross-encoder"), str(rd / "candidates.parquet"),
                                 tmp_path / "scored", max_length=cfg.cross_encoder.max_length,
                                 precision=cfg.labeling.precision, block_size=cfg.labeling.block_size)
    cands, silver = pq.read_table(rd / "candidates.parquet"), pq.read_table(rd / "silver.parquet")
    scored = pq.read_table(tmp_path / "scored")
    assert summary.pairs == scored.num_rows == silver.num_rows
    assert scored.column_names == [*cands.column_names, "score"] and scored.drop_columns(["score"]).equals(cands)
    np.testing.assert_allclose(scored.column("score").to_numpy(), silver.column(schema.LABEL).to_numpy(), atol=1e-5)


@pytest.mark.timeout(600)
def test_a_rerun_reuses_finished_stages_and_a_changed_setting_trains_from_scratch(finished_run, tmp_path):
    import shutil

    cfg, stsb, metrics, _ = finished_run
    rd = cfg.resolved_run_dir
    first = {name: _sha256(rd / "stages" / name / metrics.stage(name).fingerprint[:16] / "model" / "model.safetensors")
             for name in ("gold_only", "augsbert")}
    again = run_job(cfg)
    assert sorted(again.stages_reused) == sorted(
        ["cross_encoder", "eval_cross_encoder", "eval_zero_shot", "gold_only", "eval_gold_only", "candidates",
         "silver", "augsbert", "eval_augsbert"])
    assert again.scores == metrics.scores and again.cluster is None  # nothing to do: Ray was never needed

    # A fresh directory holding only what the changed settings do not touch (no bi-encoder
    # training of any kind): the reference for what a changed setting must train.
    fresh_dir = tmp_path / "fresh"
    shutil.copytree(rd, fresh_dir, ignore=shutil.ignore_patterns("gold_only", "augsbert", "models", "candidates",
                                                                 "silver"))
    # Fewer neighbours, another learning rate and a one-layer student: the teacher stays;
    # candidates, labels and both bi-encoders are redone (and the zero-shot score, of one layer now).
    changes = {"sampling": cfg.sampling.model_copy(update={"top_k": 1}),
               "bi_encoder": cfg.bi_encoder.model_copy(update={"lr": 5e-4, "num_layers": 1})}
    changed = cfg.model_copy(update=changes)
    lines = []
    with lines_to(lines.append):
        third = run_job(changed)
    assert sorted(third.stages_reused) == ["cross_encoder", "eval_cross_encoder"]
    assert third.result("candidates").candidates < metrics.result("candidates").candidates
    assert not any("resumed from the checkpoint" in line for line in lines)
    reference = run_job(changed.model_copy(update={"run_dir": str(fresh_dir)}))
    assert sorted(reference.stages_reused) == ["cross_encoder", "eval_cross_encoder"]
    for name, published in (("gold_only", "bi-encoder-gold-only"), ("augsbert", "bi-encoder-augsbert")):
        weights = _sha256(rd / "models" / published / "model.safetensors")
        assert weights == _sha256(fresh_dir / "models" / published / "model.safetensors"), name  # as if never run
        assert weights != first[name], name  # and not the earlier setting's model
    assert third.scores == reference.scores
    from sentence_transformers import SentenceTransformer

    student = SentenceTransformer(str(rd / "models" / "bi-encoder-augsbert"), device="cpu")
    assert student[0].auto_model.config.num_hidden_layers == 1  # the changed num_layers took

    # Back to the first settings: everything is still there, nothing runs again.
    back = run_job(cfg)
    assert len(back.stages_reused) == 9 and back.scores == metrics.scores
    assert_cards(cfg, back)  # every stage reused: the cards are the first settings' again
    assert _sha256(rd / "models/bi-encoder-augsbert/model.safetensors") == first["augsbert"]  # republished


def test_until_runs_the_stage_and_what_it_depends_on_and_nothing_beside_it(finished_run, tmp_path):
    import shutil

    cfg, _, metrics, _ = finished_run
    rd = tmp_path / "run"
    shutil.copytree(cfg.resolved_run_dir, rd)
    # More neighbours (a setting no other test runs) and another student learning rate: the
    # candidates and both students are stale, but only the candidates are asked for, and they read the gold pairs alone.
    changed = cfg.model_copy(update={"run_dir": str(rd),
                                     "sampling": cfg.sampling.model_copy(update={"top_k": 4}),
                                     "bi_encoder": cfg.bi_encoder.model_copy(update={"lr": 3e-4})})
    trained = {name: sorted(p.name for p in (rd / "stages" / name).iterdir()) for name in ("gold_only", "augsbert")}
    partial = run_job(changed, until="candidates")
    assert not partial.complete
    assert [s.name for s in partial.stages] == ["gold", "candidates"]
    assert not partial.stage("candidates").reused
    assert partial.result("candidates").candidates > metrics.result("candidates").candidates
    for name, before in trained.items():  # not trained for the new setting
        assert sorted(p.name for p in (rd / "stages" / name).iterdir()) == before, name


def test_gold_repeat_retrains_both_students_on_gold_repeated(finished_run, tmp_path):
    import shutil

    cfg, _, metrics, _ = finished_run
    rd = tmp_path / "run"
    shutil.copytree(cfg.resolved_run_dir, rd)
    changed = cfg.model_copy(update={"run_dir": str(rd),
                                     "bi_encoder": cfg.bi_encoder.model_copy(update={"gold_repeat": 3})})
    again = run_job(changed)
    # BM25's candidates and the teacher's labels do not depend on the students
    assert {"cross_encoder", "candidates", "silver"} <= set(again.stages_reused)
    assert not {"gold_only", "augsbert"} & set(again.stages_reused)
    silver, gold = metrics.result("silver").silver, metrics.result("gold").train
    assert metrics.stage("augsbert").result.train_pairs == silver + gold
    assert again.stage("augsbert").result.train_pairs == silver + 3 * gold
    # the gold-only reference sees each gold pair as often as AugSBERT does
    assert metrics.stage("gold_only").result.train_pairs == gold
    assert again.stage("gold_only").result.train_pairs == 3 * gold
    assert again.scores["gold_only"] != metrics.scores["gold_only"]
    card = (rd / "models" / "bi-encoder-gold-only" / "README.md").read_text(encoding="utf-8")
    assert "Each gold pair counted 3x per epoch (`gold_repeat`)" in card


def test_silver_first_trains_augsbert_on_silver_then_on_gold_and_nothing_else_again(finished_run, tmp_path):
    import shutil

    cfg, _, metrics, _ = finished_run
    rd = tmp_path / "run"
    shutil.copytree(cfg.resolved_run_dir, rd)
    changed = cfg.model_copy(update={"run_dir": str(rd),
                                     "bi_encoder": cfg.bi_encoder.model_copy(update={"curriculum": "silver-first"})})
    again = run_job(changed)
    assert not {"augsbert", "eval_augsbert"} & set(again.stages_reused)
    assert {"cross_encoder", "gold_only", "candidates", "silver"} <= set(again.stages_reused)
    silver, gold = metrics.result("silver").silver, metrics.result("gold").train
    train = again.stage("augsbert").result.train
    assert [p["train_pairs"] for p in train["phases"]] == [silver, gold]  # silver alone, then gold
    assert train["train_pairs"] == again.stage("augsbert").result.train_pairs == silver + gold
    assert train["steps"] == sum(p["steps"] for p in train["phases"])
    assert again.scores["augsbert"] != metrics.scores["augsbert"]  # another model
    assert again.scores["gold_only"] == metrics.scores["gold_only"]
    card = (rd / "models" / "bi-encoder-augsbert" / "README.md").read_text(encoding="utf-8")
    assert "Trained on the silver pairs first, then on the gold pairs" in card

    # Stopped after the silver pairs' training (its model out, the stage unfinished): a re-run
    # goes on with the gold pairs from that model, and ends where the uninterrupted run did.
    folders = [p for p in (rd / "stages" / "augsbert").iterdir() if (p / "silver-first" / "trained.json").is_file()]
    assert len(folders) == 1
    from augsbert_ray.stage_cache import MARKER

    (folders[0] / MARKER).unlink()
    shutil.rmtree(folders[0] / "model")
    shutil.rmtree(folders[0] / "ray" / "train", ignore_errors=True)  # the gold pairs' checkpoints: not yet made
    lines = []
    with lines_to(lines.append):
        resumed = run_job(changed)
    assert "augsbert" not in resumed.stages_reused
    assert any("the silver pairs' training was done before" in line for line in lines)
    assert resumed.scores["augsbert"] == again.scores["augsbert"]


def test_the_pilot_scored_on_dev_then_on_folds_of_the_gold_pairs(finished_run, tmp_path):
    import shutil

    cfg, _, metrics, _ = finished_run
    rd = tmp_path / "run"
    shutil.copytree(cfg.resolved_run_dir, rd)
    checked = validate_tree({**cfg.model_dump(mode="json"), "run_dir": str(rd),
                             "evaluation": {**cfg.evaluation.model_dump(mode="json"), "pilot": True}})
    on_dev = run_job(checked)
    assert {s for s in on_dev.stage_seconds if s not in on_dev.stages_reused} - set(ALWAYS) == {"pilot"}
    p = on_dev.result("pilot").model_dump()
    assert p["scored_on"] == "dev" and p["folds"] == 0 and set(p["pilots"]) == {"gold only", "gold + silver"}
    assert p["scores"] == {k: v["dev"] for k, v in p["pilots"].items()}  # one pilot per arm: its dev score
    folded = validate_tree({**checked.model_dump(mode="json"),
                            "evaluation": {**checked.evaluation.model_dump(mode="json"), "pilot_folds": 3}})
    again = run_job(folded)
    assert {s for s in again.stage_seconds if s not in again.stages_reused} - set(ALWAYS) == {"pilot"}
    p, gold, silver = again.result("pilot").model_dump(), metrics.result("gold").train, metrics.result("silver").silver
    assert p["folds"] == 3 and p["scored_on"] == f"3 folds of the gold training pairs ({gold})"
    names = [f"{arm}, fold {f}" for arm in ("gold only", "gold + silver") for f in (1, 2, 3)]
    assert sorted(p["pilots"]) == sorted(names) and all(p["pilots"][n]["dev"] is not None for n in names)
    # Each fold's pilots train on the other two folds' gold; the silver ones also without the
    # silver pairs that hold a held-out sentence.
    assert [p["pilots"][f"gold only, fold {f}"]["train_pairs"] for f in (1, 2, 3)] == [gold * 2 // 3] * 3
    for f in (1, 2, 3):
        assert gold * 2 // 3 < p["pilots"][f"gold + silver, fold {f}"]["train_pairs"] < gold * 2 // 3 + silver
    gain = p["gain"]  # both arms on all 48 held-out pairs at once
    assert gain["difference"] == pytest.approx(p["scores"]["gold + silver"] - p["scores"]["gold only"])
    assert f"on 3 folds of the gold training pairs ({gold})" in (rd / "summary.md").read_text()


def test_teacher_check_stops_when_asked(tmp_path):
    from augsbert_ray.errors import TeacherCheckError
    from augsbert_ray.runner import Runner
    from augsbert_ray.stages import TeacherCheck
    from augsbert_ray.stages.base import Artifact

    cfg = tiny_job({s: tmp_path / f"{s}.csv" for s in ("train", "dev", "test")}, "m", tmp_path / "run")

    def check(cfg, teacher: float, student: float, lines):
        runner = Runner(cfg, RunDir(tmp_path / "run"))
        for name, value in (("eval_cross_encoder", teacher), ("eval_gold_only", student)):
            path = tmp_path / f"{name}.json"
            path.write_text(json.dumps({"dev": {"spearman": value}}))
            runner.artifacts[f"{name}/scores.json"] = Artifact(path, name)
        with lines_to(lines.append):
            return runner.run(TeacherCheck()).result

    lines = []
    assert check(cfg, 70.0, 80.0, lines).gap == -10.0 and "WARNING" in lines[-2]
    check(cfg, 80.0, 70.0, lines)
    assert "leads" in lines[-2]
    stopping = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update={"teacher_check": "stop"})})
    with pytest.raises(TeacherCheckError, match="not better"):
        check(stopping, 70.0, 80.0, lines)
    # A model that scored every dev pair the same has an undefined score (NaN): such a teacher fails.
    check(cfg, float("nan"), 70.0, lines)
    assert "WARNING" in lines[-2] and "undefined" in lines[-2]
    with pytest.raises(TeacherCheckError, match="undefined"):
        check(stopping, float("nan"), 70.0, lines)
    check(stopping, 70.0, float("nan"), lines)
    assert "WARNING" not in lines[-2] and "gold-only bi-encoder's spearman on dev is undefined" in lines[-2]


def test_carve_dev_is_seeded_and_disjoint():
    import pyarrow as pa

    from augsbert_ray.loaders.job_inputs import carve_dev

    t = pa.table({"sentence1": [f"s{i}" for i in range(50)], "split": ["train"] * 50})
    train, dev = carve_dev(t, 0.2, seed=1)
    assert dev.num_rows == 10 and train.num_rows == 40
    assert set(dev.column("split").to_pylist()) == {"dev"}
    assert not set(dev.column("sentence1").to_pylist()) & set(train.column("sentence1").to_pylist())
    assert carve_dev(t, 0.2, seed=1)[1].equals(dev) and not carve_dev(t, 0.2, seed=2)[1].equals(dev)


def test_gold_fingerprint_ignores_the_path_data_was_read_from(tmp_path):
    import shutil

    from conftest import write_stsb

    from augsbert_ray.pipeline import plan

    first = {s: write_stsb(tmp_path / f"sts-{s}.csv", 20, i) for i, s in enumerate(("train", "dev", "test"))}
    (tmp_path / "copy").mkdir()
    second = {s: shutil.copy(p, tmp_path / "copy" / p.name) for s, p in first.items()}
    plans = [plan(tiny_job(files, "embedded", tmp_path / "run")) for files in (first, second)]
    assert {k: v for k, v in plans[0].items() if k != "gold"} == {k: v for k, v in plans[1].items() if k != "gold"}
    write_stsb(second["test"], 20, 99)  # another test set: every model is scored again, none retrained
    third = plan(tiny_job(second, "embedded", tmp_path / "run"))
    changed = sorted(k for k in third if k not in ALWAYS and third[k] != plans[0][k])
    assert changed == ["eval_augsbert", "eval_cross_encoder", "eval_gold_only", "eval_zero_shot"]


@pytest.mark.slow
def test_seed_search_decides_every_encoder_and_works_with_semantic_search(tmp_path, tiny_model, ray_local):
    """Seed search is a config switch: both encoders searched, SS sampling on the searched gold-only model."""
    from conftest import write_stsb

    stsb = {s: write_stsb(tmp_path / f"sts-{s}.csv", n, seed) for s, n, seed in [("train", 32, 1), ("dev", 16, 2), ("test", 16, 3)]}
    cfg = tiny_job(stsb, tiny_model, tmp_path / "run", strategy="ss")
    cfg = validate_tree({**json.loads(cfg.model_dump_json()),
                         "seed_search": {"enabled": True, "targets": ["bi_encoder", "cross_encoder"], "seeds": [3, 4],
                                         "keep": 1, "prune_at": 0.5}})
    metrics = run_job(cfg)
    searched = metrics.to_dict()["seed_search"]
    assert sorted(searched) == ["augsbert", "cross_encoder", "gold_only"]
    for stage, rec in searched.items():
        assert rec["seeds"] == [3, 4] and rec["chosen_seed"] in (3, 4)
        finished = [t for t in rec["trials"] if t["steps"] == rec["total_steps"]]
        assert len(finished) == 1 and finished[0]["seed"] == rec["chosen_seed"]
        # the job's own evaluation of the chosen model reproduces the score the search chose it by
        assert metrics.score(stage, "dev") == pytest.approx(rec["chosen_dev"], abs=1e-3)
    summary = (cfg.resolved_run_dir / "summary.md").read_text()
    assert summary.count("Seed search for") == 3 and "training steps against" in summary


@pytest.mark.timeout(600)
def test_a_teacher_used_as_given_labels_as_the_trained_one_did_and_the_run_is_tracked(finished_run, tmp_path):
    """The job's own trained teacher given back with ``cross_encoder.train: false`` is not trained
    again: scored, labelling and deciding with the same weights, the run ends where the first one did.
    The run is tracked in MLflow (read back with its client): the stages reused from the first run
    are marked, and only the training that ran now has its loss and learning rate."""
    import os
    import shutil

    MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient  # the test extra installs it
    cfg, _, metrics, _ = finished_run
    rd = tmp_path / "run"
    shutil.copytree(cfg.resolved_run_dir, rd)
    teacher = shutil.copytree(rd / "models" / "cross-encoder", tmp_path / "teacher")
    tree = cfg.model_dump(mode="json")
    given = validate_tree({**tree, "run_dir": str(rd), "tracking": {"backend": "mlflow"},
                           "cross_encoder": {**tree["cross_encoder"], "model": str(teacher), "train": False}})
    again = run_job(given)
    teacher_stage = again.stage("cross_encoder")
    assert not teacher_stage.reused and teacher_stage.result.train == {"given": True}
    assert {"eval_zero_shot", "gold_only", "eval_gold_only", "candidates"} <= set(again.stages_reused)
    assert not {"cross_encoder", "eval_cross_encoder", "silver", "augsbert"} & set(again.stages_reused)
    assert again.scores == metrics.scores  # the same weights: the same scores, labels and student
    assert again.result("teacher_check") == metrics.result("teacher_check")
    assert again.result("ship").shipped == metrics.result("ship").shipped
    card = (rd / "models" / "cross-encoder" / "README.md").read_text(encoding="utf-8")
    assert "used as given as its teacher (`cross_encoder.train: false`)" in card and "finetuned from" not in card
    assert f"**{metrics.score('cross_encoder', 'test'):.2f}**" in card
    student = (rd / "models" / "bi-encoder-augsbert" / "README.md").read_text(encoding="utf-8")
    assert "used as given, not finetuned" in student
    summary = (rd / "summary.md").read_text(encoding="utf-8")
    uri = (rd / "mlruns").as_uri()
    assert "cross_encoder.model used as given" in summary and f"mlflow ui --backend-store-uri {uri}" in summary

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        client = MlflowClient(tracking_uri=uri)
        (run,) = client.search_runs([client.get_experiment_by_name(cfg.name).experiment_id])
        losses = client.get_metric_history(run.info.run_id, "train/bi-encoder-augsbert/loss")
        lrs = client.get_metric_history(run.info.run_id, "train/bi-encoder-augsbert/lr")
        models = {a.path for a in client.list_artifacts(run.info.run_id, "models")}
    finally:
        del os.environ["MLFLOW_ALLOW_FILE_STORE"]
    p, m, t = run.data.params, run.data.metrics, run.data.tags
    assert run.info.status == "FINISHED"
    assert p["cross_encoder.train"] == "False" and p["cross_encoder.model"] == str(teacher)
    # rank 0's log points of the one training that ran now, from its worker through the progress channel
    total = again.stage("augsbert").result.train["steps"]
    every = max(1, total // 10)
    assert [h.step for h in losses] == [s for s in range(1, total + 1) if s % every == 0 or s == total]
    assert len(lrs) == len(losses) and all(h.value > 0 for h in losses) and lrs[-1].value < lrs[0].value
    assert not any(k.startswith(("train/cross-encoder", "train/bi-encoder-gold-only")) for k in m)  # nothing trained
    assert t["stage.gold_only"] == "reused (earlier run)" and t["stage.augsbert"] == "ran"
    assert "stage/gold_only/seconds" not in m and m["stage/augsbert/seconds"] > 0
    assert t["teacher"] == "used as given (cross_encoder.train: false)"
    assert t["shipped"] == metrics.result("ship").shipped
    assert m["score/cross_encoder/test/spearman"] == metrics.score("cross_encoder", "test")
    assert m["teacher_check/gap"] == pytest.approx(metrics.result("teacher_check").gap)
    assert {"models/cross-encoder", "models/bi-encoder-augsbert", "models/bi-encoder"} <= models


def test_a_streamed_augsbert_training_reads_the_silver_file_in_blocks_and_trains_the_same_model(
        finished_run, tmp_path, monkeypatch):
    """Above the executor's size the student's gold + silver are staged from their files a block at
    a time (``training.ingest``): the driver never reads the silver table, and the model is the
    one the pairs held whole trained."""
    import shutil

    import pyarrow.parquet as pq

    from augsbert_ray.stage_cache import MARKER
    from augsbert_ray.training import ingest, ray_trainer

    cfg, _, metrics, _ = finished_run
    rd = tmp_path / "run"
    shutil.copytree(cfg.resolved_run_dir, rd)
    folder = rd / "stages" / "augsbert" / metrics.stage("augsbert").fingerprint[:16]
    assert (folder / MARKER).is_file()
    shutil.rmtree(folder)
    fed = []
    monkeypatch.setattr(ray_trainer, "feed", lambda pairs, folder, _above: fed.append(ingest.feed(pairs, folder, 0))
                        or fed[-1])
    read = []
    whole = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda source, *a, **k: read.append(str(source)) or whole(source, *a, **k))
    again = run_job(cfg.model_copy(update={"run_dir": str(rd)}))
    assert "augsbert" not in again.stages_reused and "silver" in again.stages_reused
    assert read and not [p for p in read if p.endswith("silver.parquet")], read
    assert [list(f) for f in fed] == [["staged"]]  # the one training, staged (then removed with its checkpoints)
    assert fed[0]["staged"].rows == metrics.stage("augsbert").result.train_pairs
    assert again.stage("augsbert").result.train_pairs == metrics.stage("augsbert").result.train_pairs
    assert again.scores["augsbert"] == metrics.scores["augsbert"]
    assert again.stage("augsbert").result.label_mean == pytest.approx(metrics.stage("augsbert").result.label_mean,
                                                                      rel=1e-6)
