"""What a training stage returns: its training statistics, and a seed search's record as a
section of the summary (Dodge et al. 2020: seeds scored early on dev, the best continued)."""

from __future__ import annotations

from typing import Any

from augsbert_ray.stages.base import StageResult, SummaryContext


class TrainResult(StageResult):
    """A trained encoder: the training statistics (``training.fit.fit_encoder``'s), and for a
    bi-encoder the size of its training set and its mean label."""

    train: dict[str, Any] = {}
    train_pairs: int | None = None
    label_mean: float | None = None

    @property
    def seed_search(self) -> dict | None:
        return self.train.get("seed_search")

    @property
    def given(self) -> bool:
        """The stage used its model as given (``cross_encoder.train: false``), training nothing."""
        return bool(self.train.get("given"))

    def section(self, ctx: SummaryContext) -> list[str]:
        if self.given:
            return ["Teacher: cross_encoder.model used as given (cross_encoder.train: false): not trained on the "
                    "gold pairs."]
        return [] if self.seed_search is None else seed_search_markdown(ctx.stage, self.seed_search, ctx.metric)

    def view(self, stage: str) -> dict:
        return {} if self.seed_search is None else {"seed_search": {stage: self.seed_search}}


def seed_search_markdown(stage: str, rec: dict, metric: str) -> list[str]:
    """A seed search's trials, its choice, its cost, and (audit mode) how well the early ranking held."""
    prune, total = rec["prune_step"], rec["total_steps"]
    lines = [
        f"Seed search for {stage.replace('_', ' ')}: {len(rec['seeds'])} seeds scored on dev at step {prune} of "
        f"{total}, best {rec['keep']} continued ({rec['scheduler']}{', audit' if rec['audit'] else ''}); "
        f"chose seed {rec['chosen_seed']}.",
        "",
        f"| seed | dev {metric} at step {prune} | dev {metric} at the end | steps | status |",
        "|---:|---:|---:|---:|---|",
    ]
    for t in rec["trials"]:
        early = next(score for step, score in t["curve"] if step == prune)
        end = f"{t['curve'][-1][1]:.2f}" if t["steps"] == total else ""
        lines.append(f"| {t['seed']} | {early:.2f} | {end} | {t['steps']} | {t['status']} |")
    c = rec["cost"]
    lines += ["", f"Cost: {c['search_steps']} training steps against {c['all_seeds_steps']} for training every "
              f"seed to the end ({c['search_fraction']:.0%}); {c['train_seconds']:.0f} s of training ran "
              f"({c['wall_seconds']:.0f} s wall), about {c['all_seeds_seconds_estimate']:.0f} s for every seed."]
    audit = rec.get("audit_result")
    if audit:
        rho = "n/a" if audit["rank_correlation"] is None else f"{audit['rank_correlation']:.2f}"
        lines.append(f"Audit: Spearman rank correlation of the step-{prune} and final dev rankings {rho}; the "
                     f"step-{prune} pick (seed {audit['pick_at_prune']}) "
                     + ("is" if audit["pick_is_best"] else f"is not (seed {audit['best_at_end']} is)")
                     + " the best at the end.")
    return lines
