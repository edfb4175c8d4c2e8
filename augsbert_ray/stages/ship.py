"""Which bi-encoder the job ships: never a regression against gold only.

AugSBERT does not always help (MRPC: every strategy lost to gold only; the full STSb job
with its 6-layer student: -0.99). With ``evaluation.shipping: better`` (the default) the job
ships whichever of the AugSBERT and the gold-only bi-encoder scores better on dev, as
``models/bi-encoder``, and says which with both scores; ``shipping: augsbert`` ships the
AugSBERT model whatever its score. Dev decides, so the choice never looks at test.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil

from augsbert_ray.evaluation import PRIMARY_METRIC
from augsbert_ray.stages.base import Declaration, Stage, StageParams, StageResult, SummaryContext

log = logging.getLogger(__name__)


def _link_tree(src, dst) -> None:
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)


class ShipParams(StageParams):
    policy: str  # evaluation.shipping: better or augsbert
    task: str


class ShipResult(StageResult):
    """Which bi-encoder ``models/bi-encoder`` is, and why; with both models' test scores."""

    shipped: str
    metric: str
    augsbert_dev: float
    gold_only_dev: float
    why: str
    policy: str
    augsbert_test: float | None = None
    gold_only_test: float | None = None

    def section(self, ctx: SummaryContext) -> list[str]:
        lines = []
        if self.augsbert_test is not None and self.gold_only_test is not None:
            lines.append(f"AugSBERT vs gold-only on test: {self.augsbert_test - self.gold_only_test:+.2f} points.")
        which = "AugSBERT" if self.shipped == "augsbert" else "gold-only"
        return lines + [f"Shipped as models/bi-encoder: the {which} bi-encoder ({self.why})."]

    def view(self, stage: str) -> dict:
        return {"shipped": self.model_dump(exclude={"augsbert_test", "gold_only_test"})}


class Ship(Stage):
    name = "ship"
    kind = "check"
    needs_ray = False
    always = True
    unit = "models"
    result_type = ShipResult
    publishes = {"model": "models/bi-encoder"}

    def declare(self, cfg) -> Declaration:
        return Declaration(ShipParams(policy=cfg.evaluation.shipping, task=cfg.task),
                           inputs={"augsbert": "augsbert/model", "augsbert_scores": "eval_augsbert/scores.json",
                                   "gold_only": "gold_only/model", "gold_only_scores": "eval_gold_only/scores.json"},
                           outputs=("model", "shipped.json"))

    def run(self, inputs, params: ShipParams, env) -> ShipResult:
        metric = PRIMARY_METRIC[params.task]
        aug_scores, gold_scores = inputs.json("augsbert_scores"), inputs.json("gold_only_scores")
        aug, gold = aug_scores["dev"][metric], gold_scores["dev"][metric]
        if params.policy == "augsbert":
            choice, why = "augsbert", "evaluation.shipping is augsbert"
        elif math.isnan(aug) or math.isnan(gold):  # a model that scored every dev pair the same
            choice = "gold_only" if math.isnan(aug) and not math.isnan(gold) else "augsbert"
            undefined = " and ".join(n for n, v in (("AugSBERT's", aug), ("gold only's", gold)) if math.isnan(v))
            why = f"{undefined} dev {metric} is undefined (every pair scored the same)"
        elif f"{aug:.2f}" == f"{gold:.2f}":  # equal as shown: not called a lead
            choice = "augsbert" if aug >= gold else "gold_only"
            why = (f"AugSBERT and gold only tie on dev ({aug:.2f}); a tie ships AugSBERT" if aug >= gold else
                   f"AugSBERT and gold only tie on dev to two decimals ({aug:.2f}); gold only is higher by "
                   f"{gold - aug:.4f}")
        elif aug > gold:
            choice, why = "augsbert", f"AugSBERT leads gold only on dev ({aug:.2f} vs {gold:.2f})"
        else:
            choice, why = "gold_only", f"gold only leads AugSBERT on dev ({gold:.2f} vs {aug:.2f})"
        target = env.out / "model"
        if target.exists():
            shutil.rmtree(target)
        _link_tree(inputs.path(choice), target)
        test = lambda scores: scores["test"][metric] if "test" in scores else None  # noqa: E731 (reported only)
        result = ShipResult(shipped=choice, metric=metric, augsbert_dev=aug, gold_only_dev=gold, why=why,
                            policy=params.policy, augsbert_test=test(aug_scores), gold_only_test=test(gold_scores))
        (env.out / "shipped.json").write_text(json.dumps(result.model_dump(), indent=2), encoding="utf-8")
        log.info(f"[ship] models/bi-encoder is the {'AugSBERT' if choice == 'augsbert' else 'gold-only'} "
                 f"bi-encoder: {why}")
        return result
