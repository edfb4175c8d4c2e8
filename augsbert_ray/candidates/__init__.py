"""Samplers: which unlabelled pairs the cross-encoder labels (AugSBERT section 3).

Every sampler is a function ``sample(ctx: SamplingContext) -> pa.Table`` returning
``schema.CANDIDATE_SCHEMA`` rows that obey ``pairs.finalize_candidates``' rules. A
strategy may also select from its labelled pool after labelling (``SELECTORS``: KDE).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from augsbert_ray.candidates import bm25, combined, kde, random_pairs, semantic


@dataclass
class SamplingContext:
    sentences: pa.Table  # schema.SENTENCE_SCHEMA: the unique gold training sentences
    gold_keys: np.ndarray  # pairs.pair_keys of the gold pairs, excluded from candidates
    cfg: "object"  # config.SamplingConfig
    work_dir: Path  # where a sampler may keep an index
    seed: int
    # Semantic search: the bi-encoder that embeds sentences (path), its token limit, and
    # the resources of one embedding actor.
    bi_encoder: str | None = None
    max_length: int = 128
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    # A picklable progress.StageProgress (e.g. progress_channel's handle.stage("candidates")):
    # samplers add the sentences they will search to its total and advance it per batch.
    progress: object = None
    # The job's warm hosts (``workers.HostPool``) to search and embed on instead of a Ray Data
    # pool (``candidates.hosts``): the caller decides (``hosts.use_hosts``), and passes
    # ``bi_encoder`` as a local path then. None: a Ray Data pool.
    hosts: object = None

    @property
    def on_hosts(self) -> bool:
        return self.hosts is not None


# The job config lists these names (config.Strategy) without importing any sampler; a test
# checks that both agree.
SAMPLERS: dict[str, Callable[[SamplingContext], pa.Table]] = {
    "bm25": bm25.sample,  # section 3.1: lexical top-k
    "ss": semantic.sample,  # section 3.1: bi-encoder top-k (needs SamplingContext.bi_encoder)
    "bm25+ss": combined.sample,  # section 3.1: union of both, origins kept
    "rs": random_pairs.sample,  # section 3.1: uniform random partners
    "kde": kde.sample,  # section 3.1: a random pool, thinned after labelling (SELECTORS)
    # BM25's top-k as KDE's pool: random pairs of a paraphrase task are almost never positives,
    # so a random pool leaves KDE nearly nothing to keep of them.
    "bm25-kde": bm25.sample,
}


# Strategies that embed sentences with a bi-encoder (so their candidates depend on it).
EMBEDS: frozenset[str] = frozenset({"ss", "bm25+ss"})

# Strategies that label a pool and then keep part of it: name -> select(silver, gold_labels,
# task, seed, sampling_cfg) -> the kept silver rows.
SELECTORS: dict[str, Callable] = {"kde": kde.select, "bm25-kde": kde.select}


def get_sampler(name: str) -> Callable[[SamplingContext], pa.Table]:
    """Looks a sampler up by name; an unknown name lists the valid ones."""
    try:
        return SAMPLERS[name]
    except KeyError:
        raise ValueError(f"unknown sampling strategy '{name}'; valid: {', '.join(sorted(SAMPLERS))}") from None
