"""Step 1 (AugSBERT section 3): the cross-encoder fine-tuned on the gold pairs.

Sigmoid output, binary cross-entropy on the gold labels scaled to [0, 1]. It reads the
training pairs only (dev too when a seed search picks its seed): changing the test set
never retrains it.
"""

from __future__ import annotations

from augsbert_ray.config import CrossEncoderConfig, SeedSearchConfig, TrainingConfig
from augsbert_ray.evaluation import PRIMARY_METRIC
from augsbert_ray.versions import versions
from augsbert_ray.run_cards import training_facts, write_trained_card
from augsbert_ray.graph import Demand
from augsbert_ray.schema import PAIR_COLUMNS
from augsbert_ray.stages.base import Declaration, Stage, StageParams, placement_field
from augsbert_ray.stages.training_result import TrainResult
from augsbert_ray.training.fit import (fit_encoder, fixed_seconds, host_start_seconds, hparams, planned_steps,
                                       throughput)


def training_demand(cfg, cluster, workers: int | None = None) -> Demand:
    """What a training (or a scoring, ``workers=1``) holds: each worker's CPUs, and a GPU each
    with ``training.use_gpu`` (``cluster`` unknown: one CPU, so that it runs alone)."""
    from augsbert_ray.runtime import per_worker_cpus

    t = cfg.training
    if cluster is None:
        return Demand(cpus=1.0)
    n = t.num_workers if workers is None else workers
    return Demand(cpus=per_worker_cpus(t.cpus_per_worker, cluster.cpus, t.num_workers) * n,
                  gpus=float(n) if t.use_gpu else 0.0)


def searched(cfg, kind: str) -> bool:
    """Whether the seed search decides this encoder (``bi_encoder`` or ``cross_encoder``)."""
    return cfg.seed_search.enabled and kind in cfg.seed_search.targets


class TeacherParams(StageParams):
    seed: int
    cross_encoder: CrossEncoderConfig
    training: TrainingConfig
    # The seed search that picks the teacher's seed on dev; None: trained once, with the job's seed.
    seed_search: SeedSearchConfig | None = None
    task: str | None = None  # how the search scores dev (searched only)
    eval_batch_size: int = placement_field(64)


class Teacher(Stage):
    name = "cross_encoder"
    kind = "train"
    unit = "steps"
    result_type = TrainResult
    publishes = {"model": "models/cross-encoder"}

    def throughput(self, result: TrainResult, seconds: float) -> str:
        return throughput(result.train, seconds)

    def fixed_seconds(self, result: TrainResult, seconds: float) -> float | None:
        return fixed_seconds(result.train, seconds)

    def host_start_seconds(self, result: TrainResult) -> float | None:
        return host_start_seconds(result.train)

    def occupies(self, cfg, cluster) -> Demand:
        return training_demand(cfg, cluster)

    def work(self, params: TeacherParams, results):
        if "gold" not in results or params.seed_search is not None:
            return None
        steps = planned_steps(params.cross_encoder, results["gold"].train, params.training)
        return steps, "steps", "cross_encoder step"

    def declare(self, cfg) -> Declaration:
        search = searched(cfg, "cross_encoder")
        params = TeacherParams(seed=cfg.seed, cross_encoder=cfg.cross_encoder, training=cfg.training)
        inputs = {"train": "gold/train.parquet"}
        if search:  # the search scores every seed on dev
            params = params.model_copy(update={"seed_search": cfg.seed_search, "task": cfg.task,
                                               "eval_batch_size": cfg.evaluation.batch_size})
            inputs["dev"] = "gold/dev.parquet"
        return Declaration(params, inputs=inputs, outputs=("model",))

    def run(self, inputs, params: TeacherParams, env) -> TrainResult:
        c, search = params.cross_encoder, params.seed_search is not None
        train = inputs.table("train").select(PAIR_COLUMNS)
        stats = fit_encoder(
            "cross_encoder", train,
            inputs.table("dev").select(PAIR_COLUMNS) if search else None,
            recipe={"model": env.base_model(c.model), "max_length": c.max_length},
            hparams=hparams(c, params.seed, params.training), training=params.training,
            seed_search=params.seed_search, searched=search,
            task=params.task if search else "regression",
            metric=PRIMARY_METRIC[params.task] if search else "spearman",
            eval_batch_size=params.eval_batch_size,
            out=env.out, storage=env.storage, cluster=env.cluster, name="cross-encoder",
            progress=None if search else env.reporter(), executor=env.executor(params.training))
        write_trained_card("cross_encoder", env.out / "model", c.model,
                           training_facts(c, "bce", params.seed, params.training.precision, stats, train.num_rows),
                           gold_train=train.num_rows, versions=versions())
        return TrainResult(train=stats)
