"""Experiment tracking (``tracking.backend``): a job's records written by the driver and read back
with MLflow's client and TensorBoard's event reader, with no Ray (the whole job's run is in
``test_pipeline.py``)."""

from __future__ import annotations

import io
import logging
import os

import pytest

from augsbert_ray.config import validate_tree
from augsbert_ray.errors import ConfigError
from augsbert_ray.metrics import RunMetrics, StageRecord
from augsbert_ray.progress import JobProgress
from augsbert_ray.progress.channel import apply_events
from augsbert_ray.stages.evaluate import EvalResult, TeacherCheckResult
from augsbert_ray.stages.ship import ShipResult
from augsbert_ray.stages.training_result import TrainResult
from augsbert_ray.tracking import job_tracking, tracking_info
from augsbert_ray.tracking.points import POINT

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")


def _job(tmp_path, backend: str, **tracking) -> object:
    return validate_tree({"name": "tracked", "run_dir": str(tmp_path / "run"),
                          "data": {s: {"format": "stsb", "path": f"{s}.csv"} for s in ("train", "dev", "test")},
                          "cross_encoder": {"lr": 5e-5}, "tracking": {"backend": backend, **tracking}})


def _metrics(root) -> RunMetrics:
    """A run in which the teacher and the AugSBERT student trained now and the gold-only student was reused."""
    def stage(name, kind, result, seconds, reused, fixed=None):
        return StageRecord(name=name, kind=kind, fingerprint="f" * 64, seconds=seconds, reused=reused,
                           fixed_seconds=fixed, result=result)

    scores = lambda dev, test: {"dev": {"spearman": dev, "pairs": 24}, "test": {"spearman": test, "pairs": 24}}  # noqa: E731
    return RunMetrics(job="tracked", task="regression", primary_metric="spearman", run_dir=str(root), stages=[
        stage("cross_encoder", "train", TrainResult(train={"steps": 6, "seconds": 2.0}), 9.5, False, 7.5),
        stage("eval_cross_encoder", "evaluate", EvalResult(model="cross_encoder", scores=scores(71.5, 70.25)), 3.0,
              False),
        stage("gold_only", "train", TrainResult(train={"steps": 6}), 8.0, True),
        stage("eval_gold_only", "evaluate", EvalResult(model="gold_only", scores=scores(60.0, 58.5)), 2.0, True),
        stage("teacher_check", "check", TeacherCheckResult(metric="spearman", cross_encoder_dev=71.5,
                                                           gold_only_dev=60.0, gap=11.5), 0.0, False),
        stage("augsbert", "train", TrainResult(train={"steps": 12}), 11.0, False),
        stage("eval_augsbert", "evaluate", EvalResult(model="augsbert", scores=scores(64.0, 61.0)), 2.0, False),
        stage("ship", "check", ShipResult(shipped="augsbert", metric="spearman", augsbert_dev=64.0,
                                          gold_only_dev=60.0, why="AugSBERT leads on dev", policy="better"), 0.0,
              False),
    ])


def _record(tmp_path, cfg):
    """What a job's driver does for tracking: points from a worker's channel and from this process,
    the config, then the results, summary.md and a published model."""
    root = cfg.resolved_run_dir
    root.mkdir(parents=True)
    (root / "summary.md").write_text("# tracked: AugSBERT (bm25)\n", encoding="utf-8")
    model = root / "models" / "cross-encoder"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}", encoding="utf-8")
    with job_tracking(cfg, root) as tracker:
        tracker.start(cfg)
        # as rank 0 sends them through the progress channel, and as the driver replays them
        apply_events(None, [("point", "cross_encoder", {"model": "cross-encoder", "step": s, "epoch": 1,
                                                         "loss": 1.0 / s, "lr": 1e-5 * s}) for s in (2, 4, 6)])
        apply_events(None, [("message", "[augsbert] a line that carries no point")])
        # a training reporting to a display in this process
        JobProgress(["augsbert"], stream=io.StringIO()).stage("augsbert").point(
            {"model": "bi-encoder-augsbert", "step": 12, "loss": 0.25, "lr": 0.0})
        tracker.finish(_metrics(root), {"cross_encoder": "models/cross-encoder"}, root)
    apply_events(None, [("point", "augsbert", {"model": "after", "step": 1, "loss": 1.0, "lr": 0.0})])  # closed
    return root


def test_mlflow_records_a_job_in_a_file_store_under_the_run_directory(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = _job(tmp_path, "mlflow")
    root = _record(tmp_path, cfg)
    info = tracking_info(cfg, root)
    assert info["uri"] == (root / "mlruns").as_uri() and (root / "mlruns").is_dir()
    assert info["command"] == f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {info['uri']}"
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # allowed while the job wrote, not after
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        client = MlflowClient(tracking_uri=info["uri"])
        experiment = client.get_experiment_by_name("tracked")
        (run,) = client.search_runs([experiment.experiment_id])
        history = client.get_metric_history(run.info.run_id, "train/cross-encoder/loss")
        lrs = client.get_metric_history(run.info.run_id, "train/cross-encoder/lr")
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        models = {a.path for a in client.list_artifacts(run.info.run_id, "models/cross-encoder")}
    finally:
        del os.environ["MLFLOW_ALLOW_FILE_STORE"]
    assert run.info.status == "FINISHED"
    p, m, t = run.data.params, run.data.metrics, run.data.tags
    assert p["cross_encoder.lr"] == "5e-05" and p["tracking.backend"] == "mlflow" and p["cross_encoder.train"] == "True"
    assert [(h.step, h.value) for h in history] == [(2, 0.5), (4, 0.25), (6, 1.0 / 6)]
    assert [(h.step, pytest.approx(h.value)) for h in lrs] == [(2, 2e-5), (4, 4e-5), (6, 6e-5)]
    assert m["train/bi-encoder-augsbert/loss"] == 0.25 and "train/after/loss" not in m
    assert m["score/augsbert/test/spearman"] == 61.0 and m["score/gold_only/dev/spearman"] == 60.0
    assert "score/augsbert/test/pairs" not in m
    assert m["stage/cross_encoder/seconds"] == 9.5 and m["stage/cross_encoder/fixed_seconds"] == 7.5
    # a reused stage is marked, and nothing of it is recorded as run now
    assert t["stage.gold_only"] == "reused (earlier run)" and t["stage.augsbert"] == "ran"
    assert t["stages_reused"] == "gold_only, eval_gold_only"
    assert not any(k.startswith(("stage/gold_only/", "train/bi-encoder-gold-only")) for k in m)
    assert m["teacher_check/gap"] == 11.5 and "the teacher leads" in t["teacher_check"]
    assert t["shipped"] == "augsbert" and t["shipping_decision"] == "better: AugSBERT leads on dev"
    assert {"summary.md", "models"} <= artifacts and models == {"models/cross-encoder/config.json"}


def test_tensorboard_records_the_same_in_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _job(tmp_path, "tensorboard", experiment="exp")
    root = _record(tmp_path, cfg)
    (run,) = (root / "tensorboard" / "exp").iterdir()  # one folder per invocation of the job
    events = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = lambda tag: [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)]  # noqa: E731
    assert scalars("train/cross-encoder/loss") == [(2, 0.5), (4, 0.25), (6, 1.0 / 6)]
    assert scalars("train/cross-encoder/lr") == [(2, 2e-5), (4, 4e-5), (6, 6e-5)]
    assert scalars("score/augsbert/test/spearman") == [(0, 61.0)]
    assert "stage/gold_only/seconds" not in events.Tags()["scalars"]
    text = lambda tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode()  # noqa: E731
    assert "| cross_encoder.lr | 5e-05 |" in text("config")
    assert text("summary.md").startswith("# tracked")
    tags = text("tags")
    assert "| stage.gold_only | reused (earlier run) |" in tags and "| shipped | augsbert |" in tags
    assert f"| artifact.models/cross-encoder | {root / 'models' / 'cross-encoder'} |" in tags
    assert "| status | FINISHED |" in tags


def test_tracking_leaves_the_engine_loggers_level_as_it_was(tmp_path):
    engine = logging.getLogger("augsbert_ray")
    was = engine.level
    cfg = _job(tmp_path, "tensorboard")
    with job_tracking(cfg, cfg.resolved_run_dir):
        assert engine.level == was  # a user's root handler sees no more of the engine's lines than before


def test_a_failed_job_ends_its_run_failed_and_none_records_nothing(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = _job(tmp_path, "mlflow", experiment="failing")
    root = cfg.resolved_run_dir
    with pytest.raises(RuntimeError, match="stage failed"):
        with job_tracking(cfg, root) as tracker:
            tracker.start(cfg)
            raise RuntimeError("stage failed")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        client = MlflowClient(tracking_uri=tracking_info(cfg, root)["uri"])
        (run,) = client.search_runs([client.get_experiment_by_name("failing").experiment_id])
    finally:
        del os.environ["MLFLOW_ALLOW_FILE_STORE"]
    assert run.info.status == "FAILED"
    none = _job(tmp_path / "none", "none")
    assert tracking_info(none, tmp_path) == {}
    with job_tracking(none, tmp_path / "none") as tracker:
        tracker.start(none)
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("backend,module", [("mlflow", "mlflow"), ("tensorboard", "tensorboard")])
def test_a_missing_tracking_module_is_a_preflight_error_naming_the_extra(tmp_path, monkeypatch, backend, module):
    import importlib.util

    from augsbert_ray.preflight.tracking_checks import check_tracking

    cfg = _job(tmp_path, backend)
    check_tracking(cfg)  # installed here
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else find(name, *a))
    with pytest.raises(ConfigError, match=rf"tracking.backend.*{module} module.*augsbert-ray\[{module}\]"):
        check_tracking(cfg)


def test_worker_points_travel_beside_the_lines_and_only_from_a_display(tmp_path):
    from augsbert_ray.progress.channel import ProgressHandle
    from augsbert_ray.training.ray_trainer import _worker_lines

    class Recorder:
        def __init__(self):
            self.pushed = []
            self.push = self

        def remote(self, events):
            self.pushed += events

    sink = Recorder()
    progress = ProgressHandle(sink, flush_s=3600).stage("augsbert")
    point = {"model": "bi-encoder-augsbert", "step": 3, "loss": 0.5, "lr": 1e-5}
    train_log = logging.getLogger("augsbert_ray.training.loop")
    with _worker_lines({"progress": progress}, rank=0):
        train_log.info("[bi-encoder-augsbert] step 3/6 loss 0.5000", extra={POINT: point})
    with _worker_lines({"progress": progress}, rank=1):  # other ranks report nothing
        train_log.info("[bi-encoder-augsbert] step 3/6 loss 0.5000", extra={POINT: point})
    progress.target.flush()
    assert sink.pushed == [("message", "[bi-encoder-augsbert] step 3/6 loss 0.5000"), ("point", "augsbert", point)]
