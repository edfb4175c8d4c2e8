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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema
from augsbert_ray.config import resolved_objective
from augsbert_ray.errors import ConfigError
from augsbert_ray.evaluation import PRIMARY_METRIC
from augsbert_ray.runtime import per_worker_cpus
from augsbert_ray.stages.base import Declaration, Stage
from augsbert_ray.stages.student import silver_artifact, student_training_set


class Pilot(Stage):
    """Pilots scored on dev: gold only, and AugSBERT's training set with each silver set.

    Args:
        mix: AugSBERT trains on gold + silver (in-domain; across domains with
            ``target.mix_source_gold``) rather than silver alone.
        silver_sets: pilot name -> artifact id of a silver set (the autopilot's candidate
            settings); None: the job's own silver labels, as "gold + silver" (or "silver").
        gold_repeat: pilot name -> how many times its training set counts each gold pair
            (the autopilot's settings); a pilot not named: ``bi_encoder.gold_repeat``.
        objective: pilot name -> the objective its student trains with (the autopilot's
            settings); a pilot not named (the gold-only one too): ``bi_encoder.objective``.
        fraction_key: the config key holding the fraction of the steps a pilot trains.
        folds_key: the config key holding the number of folds of the gold training pairs the
            pilots are scored on (0: dev); None: always dev (the autopilot's pilots).
        baseline: a silver set's name (the job's own setting, in the autopilot): the result's
            ``over_baseline`` is the paired bootstrap of the gain of the best other silver pilot
            (its ``rival``) over it.
    """

    name = "pilot"
    kind = "check"
    unit = "pilots"

    def __init__(self, mix: bool = True, silver_sets: dict[str, str] | None = None,
                 gold_repeat: dict[str, int] | None = None, objective: dict[str, str] | None = None,
                 fraction_key: str = "evaluation.pilot_fraction",
                 folds_key: str | None = "evaluation.pilot_folds", baseline: str | None = None):
        self.mix = mix
        self.baseline = baseline
        self.silver_sets = silver_sets
        self.gold_repeat = dict(gold_repeat or {})
        self.objective = dict(objective or {})
        self.fraction_key = fraction_key
        self.folds_key = folds_key

    def _fraction(self, settings) -> float:
        return _setting(settings, self.fraction_key)

    def _folds(self, settings) -> int:
        return 0 if self.folds_key is None else _setting(settings, self.folds_key)

    def declare(self, cfg) -> Declaration:
        reads = ["seed", "bi_encoder", "training", "task", self.fraction_key, "evaluation.batch_size",
                 "evaluation.pilot_confidence"]
        if cfg.target is not None:
            reads.append("target.mix_source_gold")
        if self.folds_key is not None:
            reads.append(self.folds_key)
        silver = self.silver_sets if self.silver_sets is not None else {"silver": silver_artifact(cfg)}
        return Declaration(reads=tuple(reads), inputs={"gold": "gold/train.parquet", "dev": "gold/dev.parquet",
                                                       **{f"silver:{k}": v for k, v in silver.items()}},
                           outputs=("pilots.json",), extra=self._extra())

    def _extra(self) -> dict | None:
        """What the autopilot's pilots add to the fingerprint (None for the pilot check's)."""
        extra = {"gold_repeat": self.gold_repeat, "objective": self.objective, "baseline": self.baseline}
        return {k: v for k, v in extra.items() if v} or None

    def run(self, inputs, settings, env) -> dict:
        import json

        from augsbert_ray.evaluation import paired_bootstrap, set_score
        from augsbert_ray.training.fit import hparams
        from augsbert_ray.training.pilots import run_pilots

        b, t, task = settings.bi_encoder, settings.training, settings.task
        mix = self.mix
        gold, dev = inputs.table("gold"), inputs.table("dev")
        own = self.silver_sets is None
        names = {"silver": "gold + silver" if mix else "silver"} if own else {k: k for k in self.silver_sets}
        silvers = {label: (inputs.table(f"silver:{key}"), self.gold_repeat.get(key, b.gold_repeat))
                   for key, label in names.items()}
        folds = self._folds(settings)
        if folds:
            sets, evals, held = fold_sets(gold, silvers, task, mix, folds, settings.seed)
            scored_on = f"{folds} folds of the gold training pairs ({gold.num_rows})"
        else:
            sets = {"gold only": student_training_set(gold, None, task)}
            for label, (silver, repeat) in silvers.items():
                sets[label] = student_training_set(gold if mix else None, silver, task, repeat)
            evals, held, scored_on = dev, [dev], "dev"
        metric = PRIMARY_METRIC[task]
        results = run_pilots(
            sets, evals, kind="bi_encoder",
            recipe={"model": env.base_model(b.model), "max_length": b.max_length, "num_layers": b.num_layers,
                    "objective": b.resolved_objective(task)},
            hparams=hparams(b, settings.seed, t), fraction=self._fraction(settings), task=task,
            metric=metric, cpus_per_trial=per_worker_cpus(t.cpus_per_worker, env.cluster.cpus, 1),
            gpus_per_trial=1 if t.use_gpu else 0, storage_dir=env.storage, name="pilots",
            eval_batch_size=settings.evaluation.batch_size,
            objectives={pilot: resolved_objective(self.objective[key], task) for key, label in names.items()
                        if key in self.objective
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
        fraction, confidence = self._fraction(settings), settings.evaluation.pilot_confidence
        gain = None
        if gold_dev is not None and silver_dev is not None:
            gain = paired_bootstrap(task, preds["gold only"], preds[best], labels, confidence=confidence,
                                    seed=settings.seed)
        helps, verdict = pilot_verdict(gain)
        over_baseline = None
        rivals = {k: v for k, v in scored.items() if k != self.baseline}
        if self.baseline in scored and rivals:
            rival = max(rivals, key=lambda k: (rivals[k], k))
            over_baseline = {"rival": rival, **paired_bootstrap(task, preds[self.baseline], preds[rival], labels,
                                                                confidence=confidence, seed=settings.seed)}
        out = {"metric": metric, "fraction": fraction, "scored_on": scored_on, "folds": folds,
               "pilots": {k: r.record() for k, r in results.items()}, "scores": scores,
               "gold_only_dev": gold_dev, "best": best, "augsbert_dev": silver_dev, "gain": gain,
               "predicts_silver_helps": helps, "verdict": verdict, "over_baseline": over_baseline}
        (env.out / "pilots.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
        env.log(f"[pilot] {metric} on {scored_on} after {fraction:.0%} of the steps: gold only {_fmt(gold_dev)}, "
                + ", ".join(f"{k} {_fmt(v)}" for k, v in scores.items() if k != "gold only") + f": {verdict}")
        return out


def _setting(settings, key: str):
    section, name = key.split(".")
    return getattr(getattr(settings, section), name)


def fold_name(arm: str, fold: int) -> str:
    return f"{arm}, fold {fold + 1}"


def fold_sets(gold: pa.Table, silvers: dict, task: str, mix: bool, folds: int,
              seed: int) -> tuple[dict[str, pa.Table], dict[str, pa.Table], list[pa.Table]]:
    """The pilots of k-fold scoring: per fold, gold only and each silver set trained without
    the fold, and the fold they predict.

    Gold pairs go to ``folds`` seeded folds of equal size (within one). A fold's pilots train on
    the other folds' gold; its silver pilots also leave out every silver pair that holds one
    of the fold's sentences (BM25 would otherwise hand them the held-out pairs themselves,
    labelled by a teacher that trained on them).

    Args:
        silvers: arm name -> (silver table, gold repeat).

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
        sets[name], evals[name] = student_training_set(train, None, task), out
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
