"""How many steps a training takes: arithmetic the driver needs (progress, ETA, pilots) without
importing the training loop, whose torch import costs the driver seconds before Ray starts."""

from __future__ import annotations

import math


def steps_per_epoch(n: int, batch_size: int, world: int) -> int:
    """Steps of one epoch for ``world`` ranks taking ``batch_size`` rows each per step."""
    return math.ceil(math.ceil(n / world) / batch_size)


def rank_batch_size(batch_size: int, world: int) -> int:
    """Rows each of ``world`` data-parallel ranks takes per step.

    ``batch_size`` is the global batch (the recipe's), so more workers split it instead of
    multiplying it, and a change of ``training.num_workers`` keeps the schedule: the same
    steps, learning rate and (where it divides) the same pairs per step.
    """
    return max(1, math.ceil(batch_size / world))
