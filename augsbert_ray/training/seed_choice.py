"""The seed search's decisions, as pure functions of the dev scores (``seed_search`` wires them
to Ray Tune): which seeds continue past the pruning point, which one is the model, what the
search cost against training every seed to the end, and, in audit mode, how well the ranking
at the pruning point predicted the final one (Dodge et al. 2020; the AugSBERT paper's
Appendix D).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence


def ranked(scores: Mapping[int, float]) -> list[int]:
    """Seeds best first by dev score; equal scores go to the smaller seed, so the order (and
    every choice made from it) is deterministic. A NaN score ranks last."""
    def key(s: int):
        nan = math.isnan(scores[s])
        return nan, 0.0 if nan else -scores[s], s

    return sorted(scores, key=key)


def check_keep(keep: int, seeds: int) -> None:
    """Raises ValueError unless between 1 and all of ``seeds`` seeds continue."""
    if not 1 <= keep <= seeds:
        raise ValueError(f"seed search keeps {keep} of {seeds} seeds; need 1 <= keep <= seeds")


def survivors(at_prune: Mapping[int, float], keep: int) -> list[int]:
    """The ``keep`` seeds that continue past the pruning point (exactly ``keep``; ``check_keep``)."""
    check_keep(keep, len(at_prune))
    return ranked(at_prune)[:keep]


def chosen(final: Mapping[int, float]) -> int:
    """The model: the survivor with the best final dev score (ties: the smaller seed)."""
    return ranked(final)[0]


def statuses(seeds: Sequence[int], continued: Sequence[int], pick: int, audit: bool) -> dict[int, str]:
    """Each seed's fate, as the search's record reports it."""
    out = {}
    for s in seeds:
        if s == pick:
            out[s] = "chosen"
        elif s in continued:
            out[s] = "continued"
        else:
            out[s] = "pruned (trained to the end for the audit)" if audit else "pruned"
    return out


def cost(seeds: Sequence[int], continued: Sequence[int], prune: int, total: int, steps_run: int,
         train_seconds: float, wall_seconds: float) -> dict:
    """What the search spent against training every seed to the end: steps (the search's own,
    and all those run, which audit mode makes more) and seconds."""
    search_steps = len(seeds) * prune + len(continued) * (total - prune)
    all_steps = len(seeds) * total
    per_step = train_seconds / max(1, steps_run)
    return {
        "search_steps": search_steps,
        "all_seeds_steps": all_steps,
        "search_fraction": search_steps / all_steps,
        "steps_run": steps_run,
        "train_seconds": train_seconds,
        "wall_seconds": wall_seconds,
        "seconds_per_step": per_step,
        "all_seeds_seconds_estimate": per_step * all_steps,
    }


def audit(at_prune: Mapping[int, float], final: Mapping[int, float]) -> dict:
    """How well the ranking at the pruning point predicted the final one (every seed trained to
    the end): their Spearman correlation (None for one seed), the pruning point's pick, the best
    seed at the end, and whether they are the same."""
    from scipy.stats import spearmanr

    seeds = list(at_prune)
    rho = spearmanr([at_prune[s] for s in seeds], [final[s] for s in seeds]).statistic if len(seeds) > 1 else None
    pick, best = ranked(at_prune)[0], ranked(final)[0]
    return {"rank_correlation": None if rho is None or math.isnan(rho) else float(rho), "pick_at_prune": pick,
            "best_at_end": best, "pick_is_best": pick == best}
