"""Bi-encoders (SBERT: mean pooling): the references and step 3 of AugSBERT.

One stage class, three roles, differing only in what they train on:

- ``gold_only``: the gold training pairs (the reference AugSBERT must beat; across domains
  the lower bound);
- ``target_gold``: domain adaptation's upper bound, the target pairs' own labels;
- ``augsbert``: step 3, gold + silver (or target silver only, unless
  ``target.mix_source_gold``). For binary tasks the teacher's scores become classes at 0.5,
  as gold's are.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.config import BiEncoderConfig, resolved_objective
from augsbert_ray.evaluation import PRIMARY_METRIC
from augsbert_ray.model_card import SilverFacts
from augsbert_ray.report import versions
from augsbert_ray.run_cards import training_facts, write_trained_card
from augsbert_ray.stages.base import Declaration, Stage
from augsbert_ray.schema import PAIR_COLUMNS
from augsbert_ray.stages.teacher import searched, training_demand
from augsbert_ray.training.fit import fit_encoder, fixed_seconds, hparams, planned_steps, throughput

ROLES = ("gold_only", "target_gold", "augsbert")
# role -> where the latest run's model of that role is published in the run directory
PUBLISHED_AS = {"gold_only": "models/bi-encoder-gold-only", "target_gold": "models/bi-encoder-target-gold",
                "augsbert": "models/bi-encoder-augsbert"}


def silver_artifact(cfg) -> str:
    """The silver labels the student trains on: the teacher's, or their calibrated form."""
    return "silver/silver.parquet" if cfg.labeling.calibration == "none" else "calibrate/silver.parquet"


def student_training_set(gold: pa.Table | None, silver: pa.Table | None, task: str,
                         gold_repeat: int = 1) -> pa.Table:
    """What a bi-encoder trains on: the gold pairs (each ``gold_repeat`` times when silver joins
    them) and the silver pairs, whose scores become classes at 0.5 for binary tasks.

    Returns:
        The pair columns and ``schema.IS_SILVER`` (True for the pairs the teacher labelled).
    """
    if gold is None and silver is None:
        raise ValueError("a training set needs gold or silver pairs")
    parts = [] if gold is None else [_flagged(gold, False)] * (gold_repeat if silver is not None else 1)
    if silver is not None:
        silver = silver.select(PAIR_COLUMNS)
        if task == "binary":  # the teacher's score becomes a class, as gold's are
            classes = pa.array(silver.column(schema.LABEL).to_numpy() >= 0.5, pa.float32())
            silver = silver.set_column(2, silver.schema.field(schema.LABEL), classes)
        parts.append(_flagged(silver, True))
    return pa.concat_tables(parts)


def _flagged(pairs: pa.Table, silver: bool) -> pa.Table:
    pairs = pairs.select(PAIR_COLUMNS)
    return pairs.append_column(schema.IS_SILVER, pa.array([silver] * pairs.num_rows, pa.bool_()))


def bi_encoder_reads(uses_gold_repeat: bool) -> list[str]:
    """The ``bi_encoder`` keys a stage depends on: the whole section where it trains on gold +
    silver, else every key but ``gold_repeat`` (so changing it keeps the gold-only model)."""
    if uses_gold_repeat:
        return ["bi_encoder"]
    return [f"bi_encoder.{k}" for k in BiEncoderConfig.model_fields if k != "gold_repeat"]


def mixes_gold(cfg) -> bool:
    """Whether AugSBERT trains on gold + silver (in-domain always; across domains if asked)."""
    return cfg.target is None or cfg.target.mix_source_gold


class Student(Stage):
    kind = "train"
    unit = "steps"

    def throughput(self, result: dict, seconds: float) -> str:
        return throughput(result.get("train", {}), seconds)

    def fixed_seconds(self, result: dict, seconds: float) -> float | None:
        return fixed_seconds(result.get("train", {}), seconds)

    def occupies(self, cfg, cluster):
        return training_demand(cfg, cluster)

    def work(self, cfg, results):
        if searched(cfg, "bi_encoder") and self.name != "target_gold":
            return None
        if self.name == "target_gold":
            n = results.get("target", {}).get("pairs", {}).get("pairs")
        elif self.name == "gold_only":
            n = results.get("gold", {}).get("train")
        else:
            silver = results.get("silver", {}).get("silver")
            if silver is None:
                n = None
            else:
                n = silver + (results["gold"]["train"] * cfg.bi_encoder.gold_repeat if mixes_gold(cfg) else 0)
        return None if not n else (planned_steps(cfg.bi_encoder, n, cfg.training), "steps", "bi_encoder step")

    def __init__(self, role: str):
        if role not in ROLES:
            raise ValueError(f"unknown bi-encoder role '{role}'; valid: {', '.join(ROLES)}")
        self.name = role
        self.publishes = {"model": PUBLISHED_AS[role]}

    def declare(self, cfg) -> Declaration:
        # Which task's objective it trains with: the source task, or the target's for the upper bound.
        mixed = self.name == "augsbert" and mixes_gold(cfg)
        reads = ["seed", *bi_encoder_reads(mixed), "training", "task", "seed_search.enabled", "seed_search.targets"]
        inputs = {}
        if self.name == "target_gold":
            reads.append("target.task")
            inputs["target_pairs"] = "target/pairs.parquet"
        elif self.name == "gold_only" or mixes_gold(cfg):
            inputs["gold"] = "gold/train.parquet"
        if self.name == "augsbert":
            inputs["silver"] = silver_artifact(cfg)
            if cfg.target is not None:
                reads.append("target.mix_source_gold")
        search = searched(cfg, "bi_encoder") and self.name != "target_gold"
        if search:
            reads += ["seed_search", "evaluation.batch_size"]
            inputs["dev"] = "gold/dev.parquet"
        return Declaration(reads=tuple(reads), inputs=inputs, outputs=("model",))

    def run(self, inputs, settings, env) -> dict:
        b = settings.bi_encoder
        task = (settings.target.task or settings.task) if self.name == "target_gold" else settings.task
        gold = next((inputs.table(k) for k in ("target_pairs", "gold") if k in inputs), None)
        silver = inputs.table("silver") if "silver" in inputs else None
        repeat = b.gold_repeat if silver is not None and gold is not None else 1
        train = student_training_set(gold, silver, settings.task, repeat)
        search = "dev" in inputs
        objective = resolved_objective(b.objective, task)
        stats = fit_encoder(
            "bi_encoder", train, inputs.table("dev").select(PAIR_COLUMNS) if search else None,
            recipe={"model": env.base_model(b.model), "max_length": b.max_length, "num_layers": b.num_layers,
                    "objective": objective},
            hparams=hparams(b, settings.seed, settings.training), training=settings.training,
            seed_search=settings.seed_search if search else None, searched=search, task=settings.task,
            metric=PRIMARY_METRIC[settings.task], eval_batch_size=settings.evaluation.batch_size if search else 64,
            out=env.out, storage=env.storage, cluster=env.cluster, name=f"bi-encoder-{self.name.replace('_', '-')}",
            log=env.log, progress=None if search else env.reporter())
        facts = training_facts(b, objective, settings.seed, settings.training.precision, stats, train.num_rows)
        write_trained_card(self.name, env.out / "model", b.model, facts,
                           gold_train=None if gold is None else gold.num_rows,
                           silver=None if silver is None else SilverFacts(silver.num_rows, repeat, gold is not None),
                           versions=versions())
        return {"train": stats, "train_pairs": train.num_rows,
                "label_mean": float(np.mean(train.column(schema.LABEL).to_numpy())) if train.num_rows else None}
