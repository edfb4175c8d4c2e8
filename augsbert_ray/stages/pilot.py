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
"""

from __future__ import annotations

from augsbert_ray import schema
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
        fraction_key: the config key holding the fraction of the steps a pilot trains.
    """

    name = "pilot"
    kind = "check"
    unit = "pilots"

    def __init__(self, mix: bool = True, silver_sets: dict[str, str] | None = None,
                 gold_repeat: dict[str, int] | None = None, fraction_key: str = "evaluation.pilot_fraction"):
        self.mix = mix
        self.silver_sets = silver_sets
        self.gold_repeat = dict(gold_repeat or {})
        self.fraction_key = fraction_key

    def _fraction(self, settings) -> float:
        section, key = self.fraction_key.split(".")
        return getattr(getattr(settings, section), key)

    def declare(self, cfg) -> Declaration:
        reads = ["seed", "bi_encoder", "training", "task", self.fraction_key, "evaluation.batch_size",
                 "evaluation.pilot_confidence"]
        if cfg.target is not None:
            reads.append("target.mix_source_gold")
        silver = self.silver_sets if self.silver_sets is not None else {"silver": silver_artifact(cfg)}
        return Declaration(reads=tuple(reads), inputs={"gold": "gold/train.parquet", "dev": "gold/dev.parquet",
                                                       **{f"silver:{k}": v for k, v in silver.items()}},
                           outputs=("pilots.json",),
                           extra={"gold_repeat": self.gold_repeat} if self.gold_repeat else None)

    def run(self, inputs, settings, env) -> dict:
        import json

        from augsbert_ray.evaluation import paired_bootstrap
        from augsbert_ray.training.fit import hparams
        from augsbert_ray.training.pilots import run_pilots

        b, t, task = settings.bi_encoder, settings.training, settings.task
        mix = self.mix
        gold = inputs.table("gold")
        own = self.silver_sets is None
        names = {"silver": "gold + silver" if mix else "silver"} if own else {k: k for k in self.silver_sets}
        sets = {"gold only": student_training_set(gold, None, task)}
        for key, label in names.items():
            sets[label] = student_training_set(gold if mix else None, inputs.table(f"silver:{key}"), task,
                                               self.gold_repeat.get(key, b.gold_repeat))
        metric = PRIMARY_METRIC[task]
        results = run_pilots(
            sets, inputs.table("dev"), kind="bi_encoder",
            recipe={"model": env.base_model(b.model), "max_length": b.max_length, "num_layers": b.num_layers,
                    "objective": b.resolved_objective(task)},
            hparams=hparams(b, settings.seed, t), fraction=self._fraction(settings), task=task,
            metric=metric, cpus_per_trial=per_worker_cpus(t.cpus_per_worker, env.cluster.cpus, 1),
            gpus_per_trial=1 if t.use_gpu else 0, storage_dir=env.storage, name="pilots",
            eval_batch_size=settings.evaluation.batch_size)
        scores = {k: r.dev for k, r in results.items()}
        gold_dev = scores["gold only"]
        scored = {k: v for k, v in scores.items() if k != "gold only" and v is not None}
        best = max(scored, key=lambda k: (scored[k], k)) if scored else None
        silver_dev = scored.get(best)
        fraction, confidence = self._fraction(settings), settings.evaluation.pilot_confidence
        gain = None
        if gold_dev is not None and silver_dev is not None:
            gain = paired_bootstrap(task, results["gold only"].preds, results[best].preds,
                                    inputs.table("dev").column(schema.LABEL).to_numpy(), confidence=confidence,
                                    seed=settings.seed)
        helps, verdict = pilot_verdict(gain)
        out = {"metric": metric, "fraction": fraction, "pilots": {k: r.record() for k, r in results.items()},
               "gold_only_dev": gold_dev, "best": best, "augsbert_dev": silver_dev, "gain": gain,
               "predicts_silver_helps": helps, "verdict": verdict}
        (env.out / "pilots.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
        env.log(f"[pilot] {metric} on dev after {fraction:.0%} of the steps: gold only {_fmt(gold_dev)}, "
                + ", ".join(f"{k} {_fmt(v)}" for k, v in scores.items() if k != "gold only") + f": {verdict}")
        return out


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
