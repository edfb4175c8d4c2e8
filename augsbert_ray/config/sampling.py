"""Step 2.1: which unlabelled pairs the teacher labels (AugSBERT section 3)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from augsbert_ray.config.fields import Section, placement

# The sampling strategies (AugSBERT section 3.1); augsbert_ray.candidates.SAMPLERS implements
# exactly these (a test checks), so validating a job file needs no sampler code.
Strategy = Literal["bm25", "ss", "bm25+ss", "rs", "kde", "bm25-kde"]

# Strategies whose labelled pool is thinned afterwards to gold's label density (KDE selection).
SELECTED: frozenset[str] = frozenset({"kde", "bm25-kde"})


class FaissConfig(Section):
    """The vector index of semantic-search sampling."""

    index: Literal["flat", "ivf", "hnsw"] = Field("flat", description="flat: exact inner product (cosine); ivf, "
                                                                      "hnsw: approximate")
    ivf_nlist: int = Field(1024, gt=0, description="IVF cells (capped at sentences / 39, faiss's minimum)")
    ivf_nprobe: int = Field(16, gt=0, description="IVF cells visited per query; higher = better recall")
    hnsw_m: int = Field(32, gt=1, description="HNSW graph degree")
    hnsw_ef_search: int = Field(128, gt=0, description="HNSW beam width; higher = better recall")
    shards: int = placement(1, gt=0, description="index shards, each held by its own Ray actor (rows split evenly; "
                                                 "the shards' top-k lists are merged exactly); 1: one index in the "
                                                 "sampling process. A large text corpus's index is cut into shards "
                                                 "of at most 256 MiB of vectors instead, on storage")
    shard_cpus: float = placement(1, gt=0, description="CPUs per shard actor (a large text corpus: per search task)")
    shard_gpus: float = placement(0, ge=0, description="GPUs per shard actor (a large text corpus: per search task)")
    use_gpu: bool = placement(True, description="flat and IVF indexes move to a GPU where faiss-gpu is installed and "
                                                "the process sees one (HNSW stays on CPU); false keeps them on CPU")


class KDEConfig(Section):
    """KDE selection (AugSBERT section 3): label a large random pool, keep to match gold's density."""

    pool_per_sentence: int = Field(10, gt=0, description="random pairs per sentence labelled before selection")
    bandwidth: float | None = Field(None, gt=0, description="scipy gaussian_kde bw_method; null: Scott's rule")


class SamplingConfig(Section):
    """Step 2.1: which unlabelled pairs the teacher labels (AugSBERT section 3)."""

    strategy: Strategy = Field("bm25", description="bm25, ss (semantic search), bm25+ss, rs (random), kde (a "
                                                   "random pool selected to gold's label density) or bm25-kde (the "
                                                   "BM25 top-k pool selected the same way: for binary tasks, gold's "
                                                   "class balance)")
    top_k: int = Field(3, gt=0, description="neighbours retrieved per sentence (bm25, ss, bm25-kde)")
    random_per_sentence: int = Field(3, gt=0, description="random partners per sentence (rs)")
    query_batch_size: int = placement(256, gt=0, description="sentences per Ray Data batch of queries")
    searchers: int = placement(1, gt=0, description="size of the query / embedding actor pool")
    executor: Literal["auto", "pool", "hosts"] = placement(
        "auto", description="what searches (bm25, bm25-kde), embeds (ss) and draws (rs, kde): pool: Ray Data (an "
                            "actor pool of sampling.searchers actors, tasks for draws) started for the stage; hosts: "
                            "one of the job's warm hosts, which hold the imports "
                            "of the stages before and start at once (only when hosts serve the job: one machine, at "
                            "most one GPU); auto: hosts up to 50,000 sentences, a pool above")
    ss_model: Literal["gold_only", "zero_shot"] = Field(
        "gold_only", description="which bi-encoder embeds sentences for semantic search: the one trained on gold "
                                 "(as in the paper) or the untrained model")
    embed_batch_size: int = placement(128, gt=0, description="sentences per forward pass when embedding")
    faiss: FaissConfig = Field(FaissConfig(), description="the vector index of semantic search")
    kde: KDEConfig = Field(KDEConfig(), description="KDE selection")
