"""Step 1 (AugSBERT section 3): the cross-encoder fine-tuned on the gold pairs.

Sigmoid output, binary cross-entropy on the gold labels scaled to [0, 1]. It reads the
training pairs only (dev too when a seed search picks its seed): changing the test set
never retrains it.
"""

from __future__ import annotations

from augsbert_ray.evaluation import PRIMARY_METRIC
from augsbert_ray.report import versions
from augsbert_ray.run_cards import training_facts, write_trained_card
from augsbert_ray.graph import Demand
from augsbert_ray.stages.base import Declaration, Stage
from augsbert_ray.schema import PAIR_COLUMNS
from augsbert_ray.training.fit import fit_encoder, fixed_seconds, hparams, planned_steps, throughput


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


class Teacher(Stage):
    name = "cross_encoder"
    kind = "train"
    unit = "steps"
    publishes = {"model": "models/cross-encoder"}

    def throughput(self, result: dict, seconds: float) -> str:
        return throughput(result.get("train", {}), seconds)

    def fixed_seconds(self, result: dict, seconds: float) -> float | None:
        return fixed_seconds(result.get("train", {}), seconds)

    def occupies(self, cfg, cluster) -> Demand:
        return training_demand(cfg, cluster)

    def work(self, cfg, results):
        if "gold" not in results or searched(cfg, "cross_encoder"):
            return None
        return planned_steps(cfg.cross_encoder, results["gold"]["train"], cfg.training), "steps", "cross_encoder step"

    def declare(self, cfg) -> Declaration:
        search = searched(cfg, "cross_encoder")
        reads = ["seed", "cross_encoder", "training", "seed_search.enabled", "seed_search.targets"]
        inputs = {"train": "gold/train.parquet"}
        if search:  # the search scores every seed on dev
            reads += ["seed_search", "task", "evaluation.batch_size"]
            inputs["dev"] = "gold/dev.parquet"
        return Declaration(reads=tuple(reads), inputs=inputs, outputs=("model",))

    def run(self, inputs, settings, env) -> dict:
        c = settings.cross_encoder
        search = settings.seed_search.enabled and "cross_encoder" in settings.seed_search.targets
        train = inputs.table("train").select(PAIR_COLUMNS)
        stats = fit_encoder(
            "cross_encoder", train,
            inputs.table("dev").select(PAIR_COLUMNS) if search else None,
            recipe={"model": env.base_model(c.model), "max_length": c.max_length},
            hparams=hparams(c, settings.seed, settings.training), training=settings.training,
            seed_search=settings.seed_search if search else None, searched=search,
            task=settings.task if search else "regression",
            metric=PRIMARY_METRIC[settings.task] if search else "spearman",
            eval_batch_size=settings.evaluation.batch_size if search else 64,
            out=env.out, storage=env.storage, cluster=env.cluster, name="cross-encoder", log=env.log,
            progress=None if search else env.reporter())
        write_trained_card("cross_encoder", env.out / "model", c.model,
                           training_facts(c, "bce", settings.seed, settings.training.precision, stats, train.num_rows),
                           gold_train=train.num_rows, versions=versions())
        return {"train": stats}
