"""Samplers: which unlabelled pairs the cross-encoder labels (AugSBERT section 3).

Every sampler is a function ``sample(ctx: SamplingContext) -> pa.Table`` returning
``schema.CANDIDATE_SCHEMA`` rows that obey ``pairs.finalize_candidates``' rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from augsbert_ray.candidates import bm25


@dataclass
class SamplingContext:
    sentences: pa.Table  # schema.SENTENCE_SCHEMA: the unique gold training sentences
    gold_keys: np.ndarray  # pairs.pair_keys of the gold pairs, excluded from candidates
    cfg: "object"  # config.SamplingConfig
    work_dir: Path  # where a sampler may keep an index
    seed: int


SAMPLERS: dict[str, Callable[[SamplingContext], pa.Table]] = {
    "bm25": bm25.sample,
}


def get_sampler(name: str) -> Callable[[SamplingContext], pa.Table]:
    """Looks a sampler up by name; an unknown name lists the valid ones."""
    try:
        return SAMPLERS[name]
    except KeyError:
        raise ValueError(f"unknown sampling strategy '{name}'; valid: {', '.join(sorted(SAMPLERS))}") from None
