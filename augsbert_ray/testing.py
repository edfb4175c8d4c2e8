"""Fault injection for the chaos tests. Production code never imports this module.

A test swaps the labelling pool's actor class for one made here::

    monkeypatch.setattr(augsbert_ray.labeling.pool, "PairScorer", dying_scorer(2, flag))
"""

from __future__ import annotations

import os
from pathlib import Path

from augsbert_ray.labeling.scorer import PairScorer


def dying_scorer(after_batches: int, flag: str | os.PathLike) -> type[PairScorer]:
    """A ``PairScorer`` whose process exits (``os._exit(1)``, no clean-up) once, mid-batch.

    The first actor to score its ``after_batches``-th batch while ``flag`` does not exist
    writes ``flag`` and dies with that batch scored but not returned, as a node lost or an
    actor killed for memory would. The class is made inside this function, so Ray ships it
    to the actors by value, settings included.

    Args:
        after_batches: the batch (counted per actor) after which the actor dies.
        flag: a file on a file system every actor sees; once it exists, no actor dies.

    Returns:
        A subclass of ``PairScorer`` for ``map_batches``.
    """
    flag = str(flag)

    class DyingPairScorer(PairScorer):
        batches = 0

        def score(self, batch):
            out = super().score(batch)
            self.batches += 1
            if self.batches >= after_batches and not os.path.exists(flag):
                Path(flag).write_text(f"actor pid {os.getpid()} exited after {self.batches} batches\n")
                os._exit(1)
            return out

    return DyingPairScorer
