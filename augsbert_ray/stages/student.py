"""Bi-encoders (SBERT: mean pooling): the references and step 3 of AugSBERT.

Three stages, differing only in what they train on:

- ``GoldOnly`` (``gold_only``): the gold training pairs (the reference AugSBERT must beat;
  across domains the lower bound), each counted as often as AugSBERT's training set counts it
  (``bi_encoder.gold_repeat``), so that AugSBERT's gain is the silver's and not more passes over gold;
- ``TargetGold`` (``target_gold``): domain adaptation's upper bound, the target pairs' own labels;
- ``AugSBERT`` (``augsbert``): step 3, gold + silver (or target silver only, unless
  ``target.mix_source_gold``), in one mixed training or, with ``bi_encoder.curriculum:
  silver-first``, the silver pairs and then the gold ones. For binary tasks the teacher's
  scores become classes at 0.5, as gold's are.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from augsbert_ray import schema
from augsbert_ray.config import BiEncoderConfig, SeedSearchConfig, TrainingConfig, resolved_objective
from augsbert_ray.evaluation import PRIMARY_METRIC
from augsbert_ray.versions import versions
from augsbert_ray.model_card import SilverFacts
from augsbert_ray.run_cards import training_facts, write_trained_card
from augsbert_ray.schema import PAIR_COLUMNS
from augsbert_ray.stages.base import Declaration, Stage, StageParams, narrowed, placement_field
from augsbert_ray.stages.teacher import searched, training_demand
from augsbert_ray.stages.training_result import TrainResult
from augsbert_ray.training.ingest import TrainingSet
from augsbert_ray.training.fit import (fit_encoder, fixed_seconds, host_start_seconds, hparams, planned_steps,
                                       throughput)

log = logging.getLogger(__name__)


def silver_artifact(cfg) -> str:
    """The silver labels the student trains on: the teacher's, or their calibrated form."""
    return "silver/silver.parquet" if cfg.labeling.calibration == "none" else "calibrate/silver.parquet"


def student_training_set(gold: pa.Table | None, silver: pa.Table | None, task: str,
                         gold_repeat: int = 1) -> pa.Table:
    """What a bi-encoder trains on: the gold pairs (each ``gold_repeat`` times) and the silver
    pairs, whose scores become classes at 0.5 for binary tasks.

    Returns:
        The pair columns and ``schema.IS_SILVER`` (True for the pairs the teacher labelled).
    """
    if gold is None and silver is None:
        raise ValueError("a training set needs gold or silver pairs")
    parts = [] if gold is None else [_flagged(gold, False)] * gold_repeat
    if silver is not None:
        silver = silver.select(PAIR_COLUMNS)
        if task == "binary":  # the teacher's score becomes a class, as gold's are
            classes = pa.array(silver.column(schema.LABEL).to_numpy() >= 0.5, pa.float32())
            silver = silver.set_column(2, silver.schema.field(schema.LABEL), classes)
        parts.append(_flagged(silver, True))
    return pa.concat_tables(parts)


def training_phases(gold: pa.Table | None, silver: pa.Table | None, task: str, gold_repeat: int = 1,
                    curriculum: str = "mixed") -> list[pa.Table]:
    """The training sets a bi-encoder trains on, one after another: one mixed set
    (``student_training_set``), or with ``curriculum`` silver-first and both kinds of pairs, the
    silver pairs alone and then the gold pairs (each ``gold_repeat`` times)."""
    if curriculum == "silver-first" and gold is not None and silver is not None:
        return [student_training_set(None, silver, task), student_training_set(gold, None, task, gold_repeat)]
    return [student_training_set(gold, silver, task, gold_repeat)]


def training_sets(gold: Path | None, silver: Path | None, task: str, gold_repeat: int = 1,
                  curriculum: str = "mixed") -> list[TrainingSet]:
    """``training_phases`` on the gold and silver files, left on storage (``ingest.TrainingSet``):
    the same pairs in the same order, read by the training a block at a time where they are many,
    so that the driver never holds the silver pairs."""
    def files(g, s, repeat):
        return TrainingSet.from_files(g, s, gold_repeat=repeat, silver_as_classes=task == "binary")

    if curriculum == "silver-first" and gold is not None and silver is not None:
        return [files(None, silver, 1), files(gold, None, gold_repeat)]
    return [files(gold, silver, gold_repeat)]


def _flagged(pairs: pa.Table, silver: bool) -> pa.Table:
    pairs = pairs.select(PAIR_COLUMNS)
    return pairs.append_column(schema.IS_SILVER, pa.array([silver] * pairs.num_rows, pa.bool_()))


def mixes_gold(cfg) -> bool:
    """Whether AugSBERT trains on gold + silver (in-domain always; across domains if asked)."""
    return cfg.target is None or cfg.target.mix_source_gold


class StudentParams(StageParams):
    seed: int
    # Every key but ``gold_repeat`` where the stage trains on no source gold (the upper bound,
    # and both students across domains without mixing): there it is put back to its default.
    bi_encoder: BiEncoderConfig
    training: TrainingConfig
    task: str  # the job's (source) task
    objective: str  # the resolved objective (the target's task decides it for the upper bound)
    # The seed search that picks the seed on dev; None: trained once, with the job's seed.
    seed_search: SeedSearchConfig | None = None
    eval_batch_size: int = placement_field(64)


def _params(cfg, *, objective_task: str, uses_gold_repeat: bool, search: bool,
            uses_curriculum: bool = False) -> StudentParams:
    b = cfg.bi_encoder
    unused = {"gold_repeat"} if not uses_gold_repeat else set()
    if not uses_curriculum:  # only AugSBERT on gold + silver has two kinds of pairs to order
        unused.add("curriculum")
    b = narrowed(b, [k for k in BiEncoderConfig.model_fields if k not in unused])
    return StudentParams(seed=cfg.seed, bi_encoder=b, training=cfg.training, task=cfg.task,
                         objective=resolved_objective(b.objective, objective_task),
                         seed_search=cfg.seed_search if search else None,
                         eval_batch_size=cfg.evaluation.batch_size if search else 64)


class BiEncoderStage(Stage):
    """What the three bi-encoder stages share: training on their inputs' pairs."""

    kind = "train"
    unit = "steps"
    result_type = TrainResult

    def throughput(self, result: TrainResult, seconds: float) -> str:
        return throughput(result.train, seconds)

    def fixed_seconds(self, result: TrainResult, seconds: float) -> float | None:
        return fixed_seconds(result.train, seconds)

    def host_start_seconds(self, result: TrainResult) -> float | None:
        return host_start_seconds(result.train)

    def occupies(self, cfg, cluster):
        return training_demand(cfg, cluster)

    def _work(self, params: StudentParams, n: int | None):
        if params.seed_search is not None or not n:
            return None
        return planned_steps(params.bi_encoder, n, params.training), "steps", "bi_encoder step"

    def _train(self, gold: Path | None, silver: Path | None, inputs, params: StudentParams,
               env) -> TrainResult:
        b, search = params.bi_encoder, params.seed_search is not None
        repeat = b.gold_repeat if gold is not None else 1
        phases = training_sets(gold, silver, params.task, repeat, b.curriculum)
        train_rows = sum(p.num_rows for p in phases)
        name = f"bi-encoder-{self.name.replace('_', '-')}"

        def fit(pairs, model, num_layers, out, storage, label, progress):
            return fit_encoder(
                "bi_encoder", pairs, inputs.table("dev").select(PAIR_COLUMNS) if search else None,
                recipe={"model": model, "max_length": b.max_length, "num_layers": num_layers,
                        "objective": params.objective},
                hparams=hparams(b, params.seed, params.training), training=params.training,
                seed_search=params.seed_search, searched=search, task=params.task,
                metric=PRIMARY_METRIC[params.task], eval_batch_size=params.eval_batch_size,
                out=out, storage=storage, cluster=env.cluster, name=label, progress=progress,
                executor=env.executor(params.training))

        base = env.base_model(b.model)
        progress = None if search else env.reporter()
        if len(phases) == 2:
            stats = self._silver_first(fit, base, phases, params, env, name, progress)
        else:
            stats = fit(phases[0], base, b.num_layers, env.out, env.storage, name, progress)
        facts = training_facts(b, params.objective, params.seed, params.training.precision, stats, train_rows)
        write_trained_card(self.name, env.out / "model", b.model, facts,
                           gold_train=None if gold is None else _rows(gold),
                           silver=None if silver is None else SilverFacts(_rows(silver), repeat, gold is not None,
                                                                          silver_first="phases" in stats),
                           gold_repeat=repeat if silver is None else 1,
                           versions=versions())
        labels = [(p.label_mean(), p.num_rows) for p in phases if p.num_rows]
        return TrainResult(train=stats, train_pairs=train_rows,
                           label_mean=sum(m * n for m, n in labels) / train_rows if train_rows else None)

    def _silver_first(self, fit, base: str, phases: list[TrainingSet], params: StudentParams, env, name: str,
                      progress) -> dict:
        """``bi_encoder.curriculum: silver-first``: the student trains on the silver pairs alone, then
        on the gold pairs from those weights; each training keeps its own checkpoints, a stage
        stopped after the first goes on with the second, and the second's steps count after the
        first's on the stage's progress."""
        silver, gold = phases
        b = params.bi_encoder
        steps = [planned_steps(b, t.num_rows, params.training) for t in phases]
        shown = [None if progress is None else OffsetProgress(progress, offset, sum(steps)) for offset in (0, steps[0])]
        first_out = env.out / "silver-first"
        first_done = first_out / "trained.json"  # written once its model is out
        if first_done.is_file():  # an earlier run's: its time and host start were not this run's
            saved = json.loads(first_done.read_text(encoding="utf-8"))
            first = {**{k: v for k, v in saved.items() if k != "host_start_seconds"}, "seconds": 0.0, "reused": True}
            log.info(f"[{self.name}] the silver pairs' training was done before: going on with the gold pairs")
        else:
            first = fit(silver, base, b.num_layers, first_out, f"{env.storage}/silver-first", f"{name}-silver",
                        shown[0])
            tmp = first_done.with_suffix(".writing")
            tmp.write_text(json.dumps(first), encoding="utf-8")
            os.replace(tmp, first_done)
            log.info(f"[{self.name}] silver pairs: {silver.num_rows} trained in {first.get('steps')} steps")
        # from the first training's model, already cut to num_layers
        second = fit(gold, env.base_model(str(first_out / "model")), None, env.out, env.storage, name, shown[1])
        log.info(f"[{self.name}] gold pairs: {gold.num_rows} trained in {second.get('steps')} steps")
        return combined_stats([first, second])


class OffsetProgress:
    """A stage's progress seen by one of its trainings: steps counted after ``offset`` earlier
    ones, out of the stage's ``total`` (picklable, as the reporter it wraps is)."""

    def __init__(self, inner, offset: int, total: int):
        self.inner, self.offset, self.total = inner, offset, total

    def set_total(self, total: float, unit: str | None = None) -> None:
        self.inner.set_total(self.total, unit)

    def add_total(self, n: float, unit: str | None = None) -> None:
        self.inner.add_total(n, unit)

    def update(self, done: float) -> None:
        self.inner.update(self.offset + done)

    def advance(self, n: float = 1) -> None:
        self.inner.advance(n)

    def message(self, line: str) -> None:
        self.inner.message(line)

    def point(self, point: dict) -> None:
        self.inner.point(point)

    def flush(self) -> None:
        self.inner.flush()


def combined_stats(phases: list[dict]) -> dict:
    """One training's statistics for trainings run one after another: steps, pairs and loop time
    added up, the last one's loss, the first one's host start; each kept under ``phases``."""
    seconds = sum(p.get("seconds") or 0.0 for p in phases)
    steps = sum(p.get("steps") or 0 for p in phases)
    trained = sum((p.get("pairs_per_s") or 0.0) * (p.get("seconds") or 0.0) for p in phases)
    out = {"precision": phases[-1].get("precision"), "steps": steps,
           "train_pairs": sum(p.get("train_pairs") or 0 for p in phases),
           "final_loss": phases[-1].get("final_loss"), "seconds": seconds,
           "pairs_per_s": trained / seconds if seconds else None, "phases": phases}
    started = [p["host_start_seconds"] for p in phases if p.get("host_start_seconds") is not None]
    if started:
        out["host_start_seconds"] = started[0]
    return out


def _rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def _search_inputs(search: bool) -> dict[str, str]:
    return {"dev": "gold/dev.parquet"} if search else {}


class GoldOnly(BiEncoderStage):
    """The bi-encoder on the gold training pairs alone."""

    name = "gold_only"
    publishes = {"model": "models/bi-encoder-gold-only"}

    def work(self, params, results):
        return self._work(params, results["gold"].train * params.bi_encoder.gold_repeat if "gold" in results else None)

    def declare(self, cfg) -> Declaration:
        search = searched(cfg, "bi_encoder")
        # As often as AugSBERT counts gold; across domains without mixing it sees none, so once.
        params = _params(cfg, objective_task=cfg.task, uses_gold_repeat=mixes_gold(cfg), search=search)
        return Declaration(params, inputs={"gold": "gold/train.parquet", **_search_inputs(search)}, outputs=("model",))

    def run(self, inputs, params: StudentParams, env) -> TrainResult:
        return self._train(inputs.path("gold"), None, inputs, params, env)


class TargetGold(BiEncoderStage):
    """Domain adaptation's upper bound: the bi-encoder on the target pairs' own labels,
    with the target task's objective (never seed-searched: dev is the source's)."""

    name = "target_gold"
    publishes = {"model": "models/bi-encoder-target-gold"}

    def work(self, params, results):
        return self._work(params, results["target"].count("pairs") if "target" in results else None)

    def declare(self, cfg) -> Declaration:
        params = _params(cfg, objective_task=cfg.target.task or cfg.task, uses_gold_repeat=False, search=False)
        return Declaration(params, inputs={"target_pairs": "target/pairs.parquet"}, outputs=("model",))

    def run(self, inputs, params: StudentParams, env) -> TrainResult:
        return self._train(inputs.path("target_pairs"), None, inputs, params, env)


class AugSBERTParams(StudentParams):
    mix: bool  # gold + silver (in-domain; across domains with target.mix_source_gold), else silver alone


class AugSBERT(BiEncoderStage):
    """Step 3: the bi-encoder on gold + silver (or the target silver alone)."""

    name = "augsbert"
    publishes = {"model": "models/bi-encoder-augsbert"}

    def work(self, params: AugSBERTParams, results):
        if "silver" not in results:
            return None
        gold = results["gold"].train * params.bi_encoder.gold_repeat if params.mix and "gold" in results else 0
        return self._work(params, results["silver"].silver + gold)

    def declare(self, cfg) -> Declaration:
        mix, search = mixes_gold(cfg), searched(cfg, "bi_encoder")
        base = _params(cfg, objective_task=cfg.task, uses_gold_repeat=mix, search=search, uses_curriculum=mix)
        params = AugSBERTParams(**dict(base), mix=mix)
        inputs = {"silver": silver_artifact(cfg), **_search_inputs(search)}
        if mix:
            inputs["gold"] = "gold/train.parquet"
        return Declaration(params, inputs=inputs, outputs=("model",))

    def run(self, inputs, params: AugSBERTParams, env) -> TrainResult:
        gold = inputs.path("gold") if params.mix else None
        return self._train(gold, inputs.path("silver"), inputs, params, env)


STUDENTS = {s.name: s for s in (GoldOnly, TargetGold, AugSBERT)}
