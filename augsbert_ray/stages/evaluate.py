"""Scoring one model on the labelled evaluation sets: a stage of its own per model.

A model is scored on gold dev and test (and, in domain adaptation, the target test and dev
sets) with the task's metrics (``augsbert_ray.evaluation``). Being its own stage, a changed
evaluation set re-scores every model and retrains none. The predictions are kept too
(``predictions.parquet``: split, gold label, the model's score), e.g. to calibrate the
teacher's scores against gold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationInfo, model_validator

from augsbert_ray import schema
from augsbert_ray.errors import TeacherCheckError
from augsbert_ray.evaluation import PRIMARY_METRIC, TARGET_METRIC, target_metrics, task_metrics, undefined_scores
from augsbert_ray.runtime import driver_is_the_only_node, per_worker_cpus
from augsbert_ray.stages.base import (Declaration, ScoreRow, Stage, StageParams, StageResult, SummaryContext,
                                      model_field, placement_field)
from augsbert_ray.workers import remote_call

log = logging.getLogger(__name__)

PAIR_COLUMNS = schema.PAIR_COLUMNS  # (re-exported for callers that score pair tables)

# model -> (what it is, the training stage that makes it; None: the configured model untrained)
MODELS = {
    "zero_shot": ("bi", None),
    "gold_only": ("bi", "gold_only"),
    "cross_encoder": ("cross", "cross_encoder"),
    "target_gold": ("bi", "target_gold"),
    "augsbert": ("bi", "augsbert"),
}


def eval_sets(cfg, model: str) -> dict[str, str]:
    """The evaluation sets a model is scored on: local name -> artifact id."""
    sets = {} if model == "target_gold" else {"dev": "gold/dev.parquet", "test": "gold/test.parquet"}
    if cfg.target is not None:
        sets["target_test"] = "target/test.parquet"
        if cfg.target.dev is not None:
            sets["target_dev"] = "target/dev.parquet"
    return sets


# model -> (order, title) in the gold scores table, and in domain adaptation's target table
ROWS = {"zero_shot": (10, "Zero-shot bi-encoder"), "gold_only": (11, "Bi-encoder, gold only"),
        "cross_encoder": (12, "Cross-encoder (teacher)"), "augsbert": (13, "AugSBERT bi-encoder (gold + silver)")}
TARGET_ROWS = {"target_gold": (0, "Upper bound: bi-encoder on target gold"),
               "augsbert": (1, "AugSBERT: bi-encoder on target silver"),
               "gold_only": (2, "Lower bound: bi-encoder on source gold"),
               "zero_shot": (3, "Zero-shot bi-encoder"),
               "cross_encoder": (4, "Cross-encoder (teacher, source gold)")}


class EvaluateParams(StageParams):
    model: str  # which model (``MODELS``)
    task: str
    target_task: str | None = None  # how the target sets are scored (domain adaptation)
    max_length: int
    base_model: str | None = model_field(None)  # the untrained bi-encoder (zero-shot), else None
    num_layers: int | None = None  # the untrained bi-encoder's layers kept
    mixed: bool = False  # AugSBERT trained on source gold + target silver (domain adaptation)
    batch_size: int = placement_field(64)
    use_gpu: bool = placement_field(False)
    cpus_per_worker: float | None = placement_field(None)
    num_workers: int = placement_field(1)


class EvalResult(StageResult):
    """One model's scores: split -> metric -> value (splits dev, test, target_test, target_dev)."""

    model: str
    scores: dict[str, dict[str, Any]]
    target_metric: str | None = None
    mixed: bool = False

    @model_validator(mode="before")
    @classmethod
    def _model_from_stage(cls, data, info: ValidationInfo):
        """A record of an earlier version names the model by its stage only (``eval_<model>``)."""
        stage = (info.context or {}).get("stage", "")
        if isinstance(data, dict) and "model" not in data and stage.startswith("eval_"):
            data = {**data, "model": stage.removeprefix("eval_")}
        return data

    def rows(self, ctx: SummaryContext) -> list[ScoreRow]:
        if self.model not in ROWS or not {"dev", "test"} & set(self.scores):
            return []
        return [ScoreRow(*ROWS[self.model], self.scores)]

    def target_rows(self, ctx: SummaryContext) -> list[ScoreRow]:
        if self.model not in TARGET_ROWS or "target_test" not in self.scores:
            return []
        order, title = TARGET_ROWS[self.model]
        if self.model == "augsbert" and self.mixed:
            title = title.replace("target silver", "source gold + target silver")
        return [ScoreRow(order, title, self.scores, self.target_metric)]

    def view(self, stage: str) -> dict:
        return {"scores": {self.model: self.scores}}

    def model_scores(self) -> dict:
        return {self.model: self.scores}


class Evaluate(Stage):
    """Scores ``model`` (see ``MODELS``) on the evaluation sets."""

    kind = "evaluate"
    unit = "pairs"
    result_type = EvalResult
    name_prefix = "eval_"

    def throughput(self, result: EvalResult, seconds: float) -> str:
        pairs = sum(split.get("pairs", 0) for split in result.scores.values())
        return f"{pairs / seconds:.1f} evaluated pairs/s" if seconds else ""

    def occupies(self, cfg, cluster):
        from augsbert_ray.stages.teacher import training_demand

        return training_demand(cfg, cluster, workers=1)

    def __init__(self, model: str):
        if model not in MODELS:
            raise ValueError(f"unknown model '{model}'; valid: {', '.join(MODELS)}")
        self.model = model
        self.encoder, self.trained_by = MODELS[model]
        self.name = f"eval_{model}"

    def declare(self, cfg) -> Declaration:
        t, b = cfg.training, cfg.bi_encoder
        untrained = self.encoder == "bi" and self.trained_by is None
        params = EvaluateParams(
            model=self.model, task=cfg.task, target_task=None if cfg.target is None else cfg.target.task or cfg.task,
            max_length=cfg.cross_encoder.max_length if self.encoder == "cross" else b.max_length,
            base_model=b.model if untrained else None, num_layers=b.num_layers if untrained else None,
            mixed=self.model == "augsbert" and cfg.target is not None and cfg.target.mix_source_gold,
            batch_size=cfg.evaluation.batch_size, use_gpu=t.use_gpu, cpus_per_worker=t.cpus_per_worker,
            num_workers=t.num_workers)
        inputs = dict(eval_sets(cfg, self.model))
        if self.trained_by is not None:
            inputs["model"] = f"{self.trained_by}/model"
        return Declaration(params, inputs=inputs, outputs=("scores.json", "predictions.parquet"))

    def run(self, inputs, params: EvaluateParams, env) -> EvalResult:
        sets = {name: inputs.table(name).select(PAIR_COLUMNS)
                for name in ("dev", "test", "target_test", "target_dev") if name in inputs}
        cpus = per_worker_cpus(params.cpus_per_worker, env.cluster.cpus, params.num_workers)
        batch, use_gpu = params.batch_size, params.use_gpu
        # On the driver's machine the models' files are on local disk: no shipping. There the
        # job's warm hosts score (their imports and model classes are loaded once for every
        # stage); without them (outside a job) and without a GPU, the driver scores itself, as a
        # Ray task would start a worker process that imports transformers to score a few pairs.
        local = driver_is_the_only_node()
        hosts = env.ctx.hosts
        here = local and not use_gpu and hosts is None

        def call(fn, model, *args):
            if here:
                return fn(str(model), *args, threads=int(cpus))
            return remote_call(hosts, fn, str(model) if local else model, *args, gpus=1 if use_gpu else 0,
                               num_cpus=cpus, num_gpus=1 if use_gpu else 0,
                               what="scoring a model (training.cpus_per_worker, training.use_gpu)")

        if self.trained_by is not None:
            model = inputs.path("model") if local else env.ship(inputs.path("model"))
        if self.encoder == "cross":
            preds = call(_predict_cross_encoder, model, sets, batch, params.max_length)
        elif self.trained_by is None:
            base = params.base_model
            preds = call(_predict_bi_encoder, base if local else env.base_model(base), sets, batch,
                         params.max_length, params.num_layers)
        else:
            preds = call(_predict_bi_encoder, model, sets, batch, params.max_length, None)
        scores = {}
        gold_sets = {s: sets[s] for s in ("dev", "test") if s in sets}
        if gold_sets:
            scores.update(task_metrics(params.task, {s: preds[s] for s in gold_sets}, gold_sets))
        target_sets = {s: sets[s] for s in ("target_test", "target_dev") if s in sets}
        target_task = params.target_task if target_sets else None
        if target_sets:
            scores.update(target_metrics(target_task, {s: preds[s] for s in target_sets}, target_sets))
        (env.out / "scores.json").write_text(json.dumps(scores, indent=2), encoding="utf-8")
        pq.write_table(pa.table({
            "split": pa.array(np.concatenate([[s] * len(preds[s]) for s in sets]) if sets else [], pa.string()),
            schema.LABEL: pa.array(np.concatenate([sets[s].column(schema.LABEL).to_numpy() for s in sets])
                                   if sets else [], pa.float32()),
            "prediction": pa.array(np.concatenate([np.asarray(preds[s], np.float32) for s in sets])
                                   if sets else [], pa.float32()),
        }), env.out / "predictions.parquet")
        log.info(f"[{self.model}] {format_scores(scores, params.task, target_task)}")
        for reason in undefined_scores({s: scores[s] for s in gold_sets}, PRIMARY_METRIC[params.task], preds):
            log.warning(f"[{self.model}] WARNING: {reason}; its {PRIMARY_METRIC[params.task]} is undefined (NaN): "
                        "the model has collapsed to one output (a failed training, or a learning rate too high)")
        return EvalResult(model=self.model, scores=scores, mixed=params.mixed,
                          target_metric=TARGET_METRIC[target_task] if target_task else None)


def format_scores(scores: dict, task: str, target_task: str | None = None) -> str:
    """``dev spearman 85.10, test spearman 82.40[, target test ...]`` for a log line."""
    m = PRIMARY_METRIC[task]
    parts = [f"{s} {m} {scores[s][m]:.2f}" for s in ("dev", "test") if s in scores]
    if "target_test" in scores and target_task is not None:
        tm = TARGET_METRIC[target_task]
        parts.append(f"target test {tm} {scores['target_test'][tm]:.2f}")
    return ", ".join(parts)


# Predictions run as Ray tasks or on a warm host (on a GPU when training uses GPUs: ``gpus``, the
# GPUs reserved for the call), or in the driver on a one-machine CPU cluster (``threads`` given);
# these are their bodies. A host sees the node's GPUs whatever it reserved, so the device follows
# the reservation, not what torch can see.
def _predict_bi_encoder(model, splits: dict, batch_size: int, max_length: int, num_layers: int | None,
                        threads: int | None = None, gpus: float = 0) -> dict:
    from augsbert_ray.devices import torch_device
    from augsbert_ray.evaluation import bi_encoder_predictions
    from augsbert_ray.models import load_bi_encoder

    with _torch_threads(threads):
        device = torch_device(gpus)
        st = load_bi_encoder(model, max_length, num_layers, device=device)
        try:
            return bi_encoder_predictions(st, splits, batch_size)
        finally:
            del st
            _free_gpu_memory()


def _predict_cross_encoder(model_dir, splits: dict, batch_size: int, max_length: int,
                           threads: int | None = None, gpus: float = 0) -> dict:
    from augsbert_ray.devices import torch_device
    from augsbert_ray.evaluation import cross_encoder_predictions
    from augsbert_ray.models import load_cross_encoder

    with _torch_threads(threads):
        device = torch_device(gpus)
        model, tokenizer = load_cross_encoder(model_dir, device=device)
        model.eval()
        try:
            return cross_encoder_predictions(model, tokenizer, splits, batch_size, max_length, device)
        finally:
            del model
            _free_gpu_memory()


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    """torch's intra-op threads for one scoring: ``threads`` (in the driver, put back after),
    or in a Ray task the CPUs it was given."""
    import torch

    before = torch.get_num_threads()
    if threads is None:  # a Ray task's CPUs; a warm host (which reserves none itself) set torch's already
        import ray

        threads = int(ray.get_runtime_context().get_assigned_resources().get("CPU", 0)) or before
    torch.set_num_threads(max(1, threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _free_gpu_memory() -> None:
    """Hands the GPU memory torch cached back to the device: the scoring worker stays alive
    (see ``runtime.remote_call``) while the next stage trains on the same GPU."""
    import gc

    import torch

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


class TeacherCheckParams(StageParams):
    task: str
    on_fail: str  # evaluation.teacher_check: warn or stop


class TeacherCheckResult(StageResult):
    metric: str
    cross_encoder_dev: float
    gold_only_dev: float
    gap: float

    def section(self, ctx: SummaryContext) -> list[str]:
        return [f"Teacher check (dev): cross-encoder {self.cross_encoder_dev:.2f} vs gold-only bi-encoder "
                f"{self.gold_only_dev:.2f} ({self.gap:+.2f})."]

    def view(self, stage: str) -> dict:
        return {"teacher_check": self.model_dump()}


class TeacherCheck(Stage):
    """AugSBERT helps only if the teacher beats the gold-only student on dev: say so loudly.

    Runs every time (a comparison of two recorded scores) and never needs Ray.

    Raises:
        TeacherCheckError: the teacher is not better and ``evaluation.teacher_check`` is ``stop``.
    """

    name = "teacher_check"
    kind = "check"
    needs_ray = False
    always = True
    unit = "checks"
    result_type = TeacherCheckResult

    def declare(self, cfg) -> Declaration:
        return Declaration(TeacherCheckParams(task=cfg.task, on_fail=cfg.evaluation.teacher_check),
                           inputs={"teacher": "eval_cross_encoder/scores.json",
                                   "student": "eval_gold_only/scores.json"},
                           outputs=("check.json",))

    def run(self, inputs, params: TeacherCheckParams, env) -> TeacherCheckResult:
        metric = PRIMARY_METRIC[params.task]
        ce = inputs.json("teacher")["dev"][metric]
        bi = inputs.json("student")["dev"][metric]
        result = TeacherCheckResult(metric=metric, cross_encoder_dev=ce, gold_only_dev=bi, gap=ce - bi)
        (env.out / "check.json").write_text(json.dumps(result.model_dump()), encoding="utf-8")
        # NaN: a model that scored every dev pair the same. A teacher like that never passes.
        if math.isnan(ce) or (not math.isnan(bi) and ce <= bi):
            message = (f"the cross-encoder ({metric} {ce:.2f} on dev) is not better than the gold-only bi-encoder "
                       f"({bi:.2f}); its silver labels are unlikely to help")
            if math.isnan(ce):
                message = (f"the cross-encoder's {metric} on dev is undefined (it gave every pair the same score); "
                           "its silver labels carry nothing to learn")
            if params.on_fail == "stop":
                raise TeacherCheckError(
                    f"{message}. Stopping before labelling (evaluation.teacher_check=stop); try a stronger "
                    "teacher (cross_encoder.model / epochs / lr) or set evaluation.teacher_check=warn")
            log.warning(f"[teacher_check] WARNING: {message}")
        elif math.isnan(bi):
            log.info(f"[teacher_check] the gold-only bi-encoder's {metric} on dev is undefined (it gave every pair "
                     f"the same score); the cross-encoder's is {ce:.2f}")
        else:
            from augsbert_ray.teacher_lead import what_it_meant

            meant = what_it_meant(ce - bi, metric)
            log.info(f"[teacher_check] cross-encoder leads the gold-only bi-encoder by {ce - bi:+.2f} {metric} on dev"
                     + (f"; {meant}" if meant else ""))
        return result
