"""Step 2.1 (AugSBERT section 3.1): the unlabelled pairs the teacher will label.

Where candidate pairs come from is a registry of sources with one signature, picked by
the job's config:

- ``gold sentences`` (in-domain): the job's sampling strategy (BM25, semantic search, both,
  random, KDE pool) over the unique sentences of the gold training pairs, gold pairs left out;
- ``target pairs`` (domain adaptation): the target pairs as they are, each distinct pair once;
- ``target corpus`` (domain adaptation): the sampling strategy over the sentences of an
  unlabelled corpus, read and cleaned by Ray Data.

Every source writes ``sentences.parquet`` (``schema.SENTENCE_SCHEMA``) and
``candidates.parquet`` (``schema.CANDIDATE_SCHEMA``, ``id1 < id2``, no self-pairs, no repeats).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from augsbert_ray import schema
from augsbert_ray.candidates import EMBEDS
from augsbert_ray.candidates.pairs import finalize_candidates, gold_pair_keys, unique_sentences
from augsbert_ray.runtime import per_worker_cpus
from augsbert_ray.stages.base import Declaration, Stage

OUTPUTS = ("sentences.parquet", "candidates.parquet")

# The sampling settings that decide which pairs a strategy finds (placement keys are left
# out of fingerprints anyway; keys of other strategies are not read at all).
_STRATEGY_READS = {
    "bm25": ("sampling.top_k",),
    "ss": ("sampling.top_k", "sampling.ss_model", "sampling.faiss"),
    "bm25+ss": ("sampling.top_k", "sampling.ss_model", "sampling.faiss"),
    "rs": ("sampling.random_per_sentence",),
    "kde": ("sampling.kde.pool_per_sentence",),
}
_PLACEMENT_READS = ("sampling.query_batch_size", "sampling.searchers", "sampling.embed_batch_size",
                    "training.use_gpu")


def _sampling_declaration(cfg) -> tuple[list[str], dict[str, str]]:
    """What sampling with the job's strategy reads: its keys, the seed, and the embedding model."""
    strategy = cfg.sampling.strategy
    reads = ["sampling.strategy", "seed", *_STRATEGY_READS[strategy], *_PLACEMENT_READS]
    inputs = {}
    if strategy in EMBEDS:
        reads.append("bi_encoder.max_length")
        if cfg.sampling.ss_model == "gold_only":
            inputs["embedder"] = "gold_only/model"
        else:
            reads.append("bi_encoder.model")
    return reads, inputs


def _sample(sentences: pa.Table, gold_keys: np.ndarray, settings, env, embedder) -> pa.Table:
    """The job's sampling strategy over ``sentences`` (pairs in ``gold_keys`` left out)."""
    from augsbert_ray.candidates import SamplingContext, get_sampler

    s = settings.sampling
    bi = None
    if s.strategy in EMBEDS:
        bi = env.ship(embedder) if embedder is not None else env.base_model(settings.bi_encoder.model)
    ctx = SamplingContext(
        sentences, gold_keys, s, env.out / "index", settings.seed,
        bi_encoder=bi, max_length=settings.bi_encoder.max_length if s.strategy in EMBEDS else 128,
        cpus_per_actor=per_worker_cpus(None, env.cluster.cpus, s.searchers),
        gpus_per_actor=1 if settings.training.use_gpu else 0, progress=env.reporter(),
    )
    return get_sampler(s.strategy)(ctx)


def _write(env, sentences: pa.Table, candidates: pa.Table) -> None:
    from augsbert_ray.rundir import write_table

    write_table(env.out / "sentences.parquet", sentences)
    write_table(env.out / "candidates.parquet", candidates, schema.CANDIDATE_SCHEMA)


# -- the sources --------------------------------------------------------------------------------
def _gold_declare(cfg) -> Declaration:
    reads, inputs = _sampling_declaration(cfg)
    return Declaration(reads=tuple(reads), inputs={"gold": "gold/train.parquet", **inputs}, outputs=OUTPUTS)


def _gold_run(inputs, settings, env) -> dict:
    gold = inputs.table("gold")
    sentences = unique_sentences(gold)
    embedder = inputs.path("embedder") if "embedder" in inputs else None
    candidates = _sample(sentences, gold_pair_keys(gold, sentences), settings, env, embedder)
    _write(env, sentences, candidates)
    env.log(f"[candidates] {candidates.num_rows} {settings.sampling.strategy} pairs from {sentences.num_rows} "
            "sentences")
    return {"source": "gold sentences", "sentences": sentences.num_rows, "candidates": candidates.num_rows}


def _pairs_declare(cfg) -> Declaration:
    return Declaration(inputs={"pairs": "target/pairs.parquet"}, outputs=OUTPUTS)


def _pairs_run(inputs, settings, env) -> dict:
    pairs = inputs.table("pairs")
    sentences = unique_sentences(pairs)
    index = {t: i for i, t in enumerate(sentences.column(schema.TEXT).to_pylist())}
    q = np.array([index[t] for t in pairs.column(schema.SENTENCE1).to_pylist()], dtype=np.int64)
    h = np.array([index[t] for t in pairs.column(schema.SENTENCE2).to_pylist()], dtype=np.int64)
    candidates = finalize_candidates(q, h, np.zeros(len(q), np.float32), sentences, np.empty(0, np.int64),
                                     origin="target")
    self_pairs = int((q == h).sum())
    repeats = pairs.num_rows - self_pairs - candidates.num_rows
    _write(env, sentences, candidates)
    env.log(f"[candidates] {candidates.num_rows} target pairs ({self_pairs} self-pairs and {repeats} repeated "
            f"pairs of {pairs.num_rows} left out) over {sentences.num_rows} sentences")
    return {"source": "target pairs", "sentences": sentences.num_rows, "candidates": candidates.num_rows,
            "target_pairs": pairs.num_rows, "self_pairs_left_out": self_pairs, "repeats_left_out": repeats}


def _corpus_declare(cfg) -> Declaration:
    from augsbert_ray.loaders.corpus import list_files

    reads, inputs = _sampling_declaration(cfg)
    # A corpus can be large: its files' names, sizes and modification times stand for its contents.
    return Declaration(reads=tuple(reads + ["target.corpus"]), inputs=inputs, outputs=OUTPUTS,
                       extra=list_files(cfg.target.corpus.path))


def _corpus_run(inputs, settings, env) -> dict:
    from augsbert_ray.loaders.corpus import read_corpus

    c = settings.target.corpus
    corpus = read_corpus(c, seed=settings.seed, log=env.log)
    embedder = inputs.path("embedder") if "embedder" in inputs else None
    candidates = _sample(corpus.sentences, np.empty(0, np.int64), settings, env, embedder)
    _write(env, corpus.sentences, candidates)
    env.log(f"[candidates] {candidates.num_rows} {settings.sampling.strategy} pairs from "
            f"{corpus.sentences.num_rows} corpus sentences")
    return {"source": "target corpus", "sentences": corpus.sentences.num_rows, "candidates": candidates.num_rows,
            "corpus_files": len(corpus.files), "corpus_lines": corpus.counts}


# source name -> (declare(cfg), run(inputs, settings, env))
SOURCES: dict[str, tuple[Callable, Callable]] = {
    "gold sentences": (_gold_declare, _gold_run),
    "target pairs": (_pairs_declare, _pairs_run),
    "target corpus": (_corpus_declare, _corpus_run),
}


def source_of(cfg) -> str:
    """The candidate source a job uses."""
    if cfg.target is None:
        return "gold sentences"
    return "target pairs" if cfg.target.pairs is not None else "target corpus"


class Candidates(Stage):
    """Candidate pairs from one of ``SOURCES`` (``source_of(cfg)`` picks the job's)."""

    name = "candidates"
    kind = "candidates"
    unit = "sentences"
    publishes = {name: name for name in OUTPUTS}

    def throughput(self, result: dict, seconds: float) -> str:
        if not seconds:
            return ""
        return (f"{result['candidates'] / seconds:.1f} candidate pairs/s "
                f"({result['sentences'] / seconds:.1f} sentences/s)")

    def __init__(self, source: str):
        if source not in SOURCES:
            raise ValueError(f"unknown candidate source '{source}'; valid: {', '.join(SOURCES)}")
        self.source = source

    def declare(self, cfg) -> Declaration:
        decl = SOURCES[self.source][0](cfg)
        return Declaration(reads=decl.reads, inputs=decl.inputs, outputs=decl.outputs,
                           extra=[self.source, decl.extra])

    def run(self, inputs, settings, env) -> dict:
        return SOURCES[self.source][1](inputs, settings, env)


def candidate_count(path) -> int:
    return pq.ParquetFile(path).metadata.num_rows
