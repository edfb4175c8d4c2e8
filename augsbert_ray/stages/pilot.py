"""A teacher check that predicts: will the silver labels help the student?

The teacher check before labelling compares the teacher with the gold-only student on dev,
which did not predict MRPC's loss (the teacher led by +0.51 F1 on dev, and every strategy
then lost 1.1-1.7 F1). This stage asks the student itself: two pilots (``training.pilots``),
the student trained for ``evaluation.pilot_fraction`` of its steps on gold alone and on gold +
silver, both scored on dev. Silver that helps the pilot is predicted to help the full run.

A pilot's lead is a prediction only when dev can tell it from chance: the two pilots' dev
predictions are resampled together (``evaluation.paired_bootstrap``), and the stage predicts
"helps" when the lower end of the ``evaluation.pilot_confidence`` interval of the gain is above
0, "does not help" when its upper end is below 0, and makes no prediction in between. On MRPC
(408 dev pairs) the silver pilot led by 0.6-0.8 F1 on two seeds and the full run then lost: a
lead that size is within what 408 pairs can tell apart.

With ``evaluation.pilot_folds`` (k) the pilots are scored on the gold training pairs instead
(``fold_sets``): k pilots per arm, each trained without one fold and predicting it, so each
arm is scored on every gold pair (MRPC: 3,668 pairs against dev's 408) by its pooled
out-of-fold predictions, and the bootstrap resamples those.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema
from augsbert_ray.config import BiEncoderConfig, TrainingConfig, resolved_objective
from augsbert_ray.errors import ConfigError
from augsbert_ray.evaluation import PRIMARY_METRIC
from augsbert_ray.runtime import per_worker_cpus
from augsbert_ray.stages.base import (Declaration, Stage, StageParams, StageResult, SummaryContext, narrowed,
                                      placement_field)
from augsbert_ray.stages.student import silver_artifact, student_training_set

log = logging.getLogger(__name__)


class PilotParams(StageParams):
    seed: int
    bi_encoder: BiEncoderConfig
    training: TrainingConfig
    task: str
    mix: bool  # AugSBERT trains on gold + silver rather than silver alone
    fraction: float  # of the student's steps a pilot trains
    folds: int = 0  # folds of the gold training pairs the pilots are scored on (0: dev)
    confidence: float
    # The autopilot's silver sets, by name (inputs ``silver:<name>``); None: the job's own silver
    # labels, piloted as "gold + silver" (or "silver").
    silver_sets: tuple[str, ...] | None = None
    # The autopilot's silver sets: pilot name -> how many times its training set counts each
    # gold pair, and the objective its student trains with (a pilot not named: the job's own).
    gold_repeat: dict[str, int] = {}
    objective: dict[str, str] = {}
    baseline: str | None = None  # the silver set the others' best is compared with (the job's own)
    batch_size: int = placement_field(64)


class PilotsResult(StageResult):
    """The pilots' dev scores and what they predict (see the module docstring)."""

    metric: str
    fraction: float
    scored_on: str = "dev"
    folds: int = 0
    pilots: dict[str, dict[str, Any]]
    scores: dict[str, float | None]
    gold_only_dev: float | None = None
    best: str | None = None
    augsbert_dev: float | None = None
    gain: dict[str, Any] | None = None
    predicts_silver_helps: bool | None = None
    verdict: str
    over_baseline: dict[str, Any] | None = None

    def section(self, ctx: SummaryContext) -> list[str]:
        arms = ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a" for k, v in self.scores.items())
        return [f"Pilot (the student after {self.fraction:.0%} of its steps, {self.metric} on {self.scored_on}): "
                f"{arms}: {self.verdict}."]

    def view(self, stage: str) -> dict:
        return {"pilot": self.model_dump()} if stage == "pilot" else {}


class Pilot(Stage):
    """Pilots scored on dev: gold only, and AugSBERT's training set with each silver set.

    ``Pilot()`` is the job's pilot check: its own silver labels, as "gold + silver" (or
    "silver"), for ``evaluation.pilot_fraction`` of the steps, scored on dev or on
    ``evaluation.pilot_folds`` folds of the gold training pairs. ``Pilot.trial`` pilots the
    autopilot's silver sets.
    """

    name = "pilot"
    kind = "check"
    unit = "pilots"
    result_type = PilotsResult
    version = 2  # 2: the gold-only arm counts gold as often as the gold-only student

    def __init__(self):
        self.silver_sets: dict[str, str] | None = None
        self.gold_repeat: dict[str, int] = {}
        self.objective: dict[str, str] = {}
        self.baseline: str | None = None
        self.fraction: float | None = None

    @classmethod
    def trial(cls, silver_sets: dict[str, str], fraction: float, gold_repeat: dict[str, int] | None = None,
              objective: dict[str, str] | None = None, baseline: str | None = None) -> "Pilot":
        """The autopilot's pilots, scored on dev.

        Args:
            silver_sets: pilot name -> artifact id of a silver set.
            fraction: of the student's steps each pilot trains (``auto.pilot_fraction``).
            gold_repeat: pilot name -> how many times its training set counts each gold pair;
                a pilot not named: ``bi_encoder.gold_repeat``.
            objective: pilot name -> the objective its student trains with; a pilot not named
                (the gold-only one too): ``bi_encoder.objective``.
            baseline: a silver set's name (the job's own setting): the result's ``over_baseline``
                is the paired bootstrap of the gain of the best other silver pilot (its ``rival``)
                over it.
        """
        pilot = cls()
        pilot.silver_sets, pilot.fraction, pilot.baseline = dict(silver_sets), fraction, baseline
        pilot.gold_repeat, pilot.objective = dict(gold_repeat or {}), dict(objective or {})
        return pilot

    def declare(self, cfg) -> Declaration:
        from augsbert_ray.stages.student import mixes_gold

        trial = self.silver_sets is not None
        ev = cfg.evaluation
        # Pilots train gold + silver in one mixed training, whatever bi_encoder.curriculum says: a
        # share of the steps is one training's share.
        student = narrowed(cfg.bi_encoder, [k for k in type(cfg.bi_encoder).model_fields if k != "curriculum"])
        params = PilotParams(seed=cfg.seed, bi_encoder=student, training=cfg.training, task=cfg.task,
                             mix=mixes_gold(cfg), fraction=self.fraction if trial else ev.pilot_fraction,
                             folds=0 if trial else ev.pilot_folds, confidence=ev.pilot_confidence,
                             silver_sets=tuple(self.silver_sets) if trial else None, gold_repeat=self.gold_repeat,
                             objective=self.objective, baseline=self.baseline,
                             batch_size=ev.batch_size)
        silver = self.silver_sets if trial else {"silver": silver_artifact(cfg)}
        return Declaration(params, inputs={"gold": "gold/train.parquet", "dev": "gold/dev.parquet",
                                           **{f"silver:{k}": v for k, v in silver.items()}},
                           outputs=("pilots.json",))

    def run(self, inputs, params: PilotParams, env) -> PilotsResult:
        import json

        from augsbert_ray.evaluation import paired_bootstrap, set_score
        from augsbert_ray.training.fit import hparams
        from augsbert_ray.training.pilots import run_pilots

        b, t, task, mix = params.bi_encoder, params.training, params.task, params.mix
        gold, dev = inputs.table("gold"), inputs.table("dev")
        own = params.silver_sets is None
        names = {"silver": "gold + silver" if mix else "silver"} if own else {k: k for k in params.silver_sets}
        silvers = {label: (inputs.table(f"silver:{key}"), params.gold_repeat.get(key, b.gold_repeat))
                   for key, label in names.items()}
        # The gold-only arm counts gold as the job's gold-only student does (stages.student.GoldOnly).
        own_repeat = b.gold_repeat if mix else 1
        folds = params.folds
        if folds:
            sets, evals, held = fold_sets(gold, silvers, task, mix, folds, params.seed, own_repeat)
            scored_on = f"{folds} folds of the gold training pairs ({gold.num_rows})"
        else:
            sets = {"gold only": student_training_set(gold, None, task, own_repeat)}
            for label, (silver, repeat) in silvers.items():
                sets[label] = student_training_set(gold if mix else None, silver, task, repeat)
            evals, held, scored_on = dev, [dev], "dev"
        metric = PRIMARY_METRIC[task]
        results = run_pilots(
            sets, evals, kind="bi_encoder",
            recipe={"model": env.base_model(b.model), "max_length": b.max_length, "num_layers": b.num_layers,
                    "objective": b.resolved_objective(task)},
            hparams=hparams(b, params.seed, t), fraction=params.fraction, task=task,
            metric=metric, cpus_per_trial=per_worker_cpus(t.cpus_per_worker, env.cluster.cpus, 1),
            gpus_per_trial=1 if t.use_gpu else 0, storage_dir=env.storage, name="pilots",
            eval_batch_size=params.batch_size,
            objectives={pilot: resolved_objective(params.objective[key], task) for key, label in names.items()
                        if key in params.objective
                        for pilot in ([label] if not folds else [fold_name(label, f) for f in range(folds)])})
        # Each arm (gold only, and gold + each silver set) scored on all its held-out pairs at once:
        # with folds, the predictions of its fold pilots, in fold order; on dev, its one pilot's.
        labels = pa.concat_tables(held).column(schema.LABEL).to_numpy()
        arms = {arm: [arm] if not folds else [fold_name(arm, f) for f in range(folds)]
                for arm in ("gold only", *silvers)}
        preds, scores = {}, {}
        for arm, pilots in arms.items():
            parts = [results[p].preds for p in pilots]
            preds[arm] = None if any(x is None for x in parts) else np.concatenate(parts)
            score = np.nan if preds[arm] is None else set_score(task, preds[arm], labels)
            scores[arm] = None if np.isnan(score) else float(score)  # NaN: every pair scored the same
        gold_dev = scores["gold only"]
        scored = {k: v for k, v in scores.items() if k != "gold only" and v is not None}
        best = max(scored, key=lambda k: (scored[k], k)) if scored else None
        silver_dev = scored.get(best)
        fraction, confidence = params.fraction, params.confidence
        gain = None
        if gold_dev is not None and silver_dev is not None:
            gain = paired_bootstrap(task, preds["gold only"], preds[best], labels, confidence=confidence,
                                    seed=params.seed)
        helps, verdict = pilot_verdict(gain)
        over_baseline = None
        rivals = {k: v for k, v in scored.items() if k != params.baseline}
        if params.baseline in scored and rivals:
            rival = max(rivals, key=lambda k: (rivals[k], k))
            over_baseline = {"rival": rival, **paired_bootstrap(task, preds[params.baseline], preds[rival], labels,
                                                                confidence=confidence, seed=params.seed)}
        out = PilotsResult(metric=metric, fraction=fraction, scored_on=scored_on, folds=folds,
                           pilots={k: r.record() for k, r in results.items()}, scores=scores,
                           gold_only_dev=gold_dev, best=best, augsbert_dev=silver_dev, gain=gain,
                           predicts_silver_helps=helps, verdict=verdict, over_baseline=over_baseline)
        (env.out / "pilots.json").write_text(json.dumps(out.model_dump(), indent=2), encoding="utf-8")
        log.info(f"[pilot] {metric} on {scored_on} after {fraction:.0%} of the steps: gold only {_fmt(gold_dev)}, "
                 + ", ".join(f"{k} {_fmt(v)}" for k, v in scores.items() if k != "gold only") + f": {verdict}")
        return out


def fold_name(arm: str, fold: int) -> str:
    return f"{arm}, fold {fold + 1}"


def fold_sets(gold: pa.Table, silvers: dict, task: str, mix: bool, folds: int,
              seed: int, gold_repeat: int = 1) -> tuple[dict[str, pa.Table], dict[str, pa.Table], list[pa.Table]]:
    """The pilots of k-fold scoring: per fold, gold only and each silver set trained without
    the fold, and the fold they predict.

    Gold pairs go to ``folds`` seeded folds of equal size (within one). A fold's pilots train on
    the other folds' gold; its silver pilots also leave out every silver pair that holds one
    of the fold's sentences (BM25 would otherwise hand them the held-out pairs themselves,
    labelled by a teacher that trained on them).

    Args:
        silvers: arm name -> (silver table, gold repeat).
        gold_repeat: how many times the gold-only pilots count each gold pair.

    Returns:
        (pilot name -> training set, pilot name -> its held-out pairs, the folds in order).
    """
    if gold.num_rows < folds:
        raise ConfigError(None, "evaluation.pilot_folds", f"{folds} folds need at least {folds} gold training "
                          f"pairs, the job has {gold.num_rows}")
    fold_of = np.random.default_rng(seed).permutation(gold.num_rows) % folds
    sets, evals, held = {}, {}, []
    for f in range(folds):
        train, out = gold.filter(pa.array(fold_of != f)), gold.filter(pa.array(fold_of == f))
        held.append(out)
        sentences = pa.array(sorted(set(out.column(schema.SENTENCE1).to_pylist())
                                    | set(out.column(schema.SENTENCE2).to_pylist())))
        name = fold_name("gold only", f)
        sets[name], evals[name] = student_training_set(train, None, task, gold_repeat), out
        for arm, (silver, repeat) in silvers.items():
            away = pc.invert(pc.or_(pc.is_in(silver.column(schema.SENTENCE1), sentences),
                                    pc.is_in(silver.column(schema.SENTENCE2), sentences)))
            name = fold_name(arm, f)
            sets[name] = student_training_set(train if mix else None, silver.filter(away), task, repeat)
            evals[name] = out
    return sets, evals, held


def pilot_verdict(gain: dict | None) -> tuple[bool | None, str]:
    """(predicts the silver helps: True, False or None for no prediction; the verdict in words)
    from ``paired_bootstrap``'s interval of the best silver pilot's gain over gold only."""
    if gain is None:
        return None, "no prediction (a pilot has no score)"
    span = (f"{gain['difference']:+.2f}, {gain['confidence']:.0%} interval "
            f"{gain['low']:+.2f} to {gain['high']:+.2f}")
    if gain["low"] > 0:
        return True, f"the silver labels help ({span})"
    if gain["high"] < 0:
        return False, f"the silver labels do not help ({span})"
    return None, f"no prediction: the difference is within what dev can tell apart ({span})"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"
