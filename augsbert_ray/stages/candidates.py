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
A large corpus sampled on shards (``candidates.sharded``) also leaves them as parts, in
order: ``sentences.parts/`` and ``candidates.parts/``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.candidates import EMBEDS
from augsbert_ray.candidates.pairs import finalize_candidates, gold_pair_keys, unique_sentences
from augsbert_ray.runtime import per_worker_cpus
from augsbert_ray.config import CorpusConfig, SamplingConfig
from augsbert_ray.stages.base import (Declaration, Stage, StageParams, StageResult, SummaryContext, model_field,
                                      narrowed, placement_field)

log = logging.getLogger(__name__)

OUTPUTS = ("sentences.parquet", "candidates.parquet")

# The sampling settings that decide which pairs a strategy finds (the others are put back to
# their defaults in the stage's params; placement keys are never fingerprinted).
_STRATEGY_USES = {
    "bm25": ("strategy", "top_k"),
    "ss": ("strategy", "top_k", "ss_model", "faiss"),
    "bm25+ss": ("strategy", "top_k", "ss_model", "faiss"),
    "rs": ("strategy", "random_per_sentence"),
    "kde": ("strategy", "kde.pool_per_sentence"),
    "bm25-kde": ("strategy", "top_k"),
}


class CandidatesParams(StageParams):
    source: str  # one of SOURCES
    seed: int = 0
    # The job's sampling settings, those its strategy does not use at their defaults (None:
    # the target pairs, taken as they are).
    sampling: SamplingConfig | None = None
    # The model that embeds the sentences (semantic search without the gold-only student);
    # None: not embedded, or embedded by the gold-only student (an input).
    embed_model: str | None = model_field(None)
    max_length: int = 128  # the embedding model's (semantic search)
    use_gpu: bool = placement_field(False)
    corpus: CorpusConfig | None = None  # the target corpus (source ``target corpus``)


class CandidatesResult(StageResult):
    """What the candidates stage found: how many sentences and pairs, from which source."""

    source: str
    strategy: str | None = None  # the sampling strategy (None: the target pairs as they are)
    top_k: int | None = None
    sentences: int
    candidates: int
    target_pairs: int | None = None
    self_pairs_left_out: int | None = None
    repeats_left_out: int | None = None
    corpus_files: int | None = None
    corpus_lines: dict[str, Any] | None = None

    def headline(self) -> str | None:
        return self.strategy or self.source

    def section(self, ctx: SummaryContext) -> list[str]:
        lines = [f"Candidates: {self.candidates} pairs from {self.sentences} sentences ({self.source}"
                 + (f", {self.strategy}" if self.strategy else "") + ")."]
        c = self.corpus_lines
        if c:
            lines.append(f"Target corpus: {c['lines']:,} lines read; {c['empty']:,} empty, "
                         f"{c['too_long']:,} too long and {c['bad']:,} bad left out, {c['truncated']:,} "
                         f"truncated, {c['duplicates']:,} repeats; {c['sentences']:,} sentences"
                         + (f" (a seeded sample of {c['distinct']:,})." if c["sampled_out"] else "."))
        return lines

    def view(self, stage: str) -> dict:
        out = {"sampling": {"strategy": self.strategy or self.source, "source": self.source, "top_k": self.top_k,
                            "sentences": self.sentences, "candidates": self.candidates}}
        target = {k: v for k, v in self.model_dump().items()
                  if (k.endswith(("_left_out", "target_pairs")) or k.startswith("corpus")) and v is not None}
        return out | ({"target": {"candidates": target}} if self.source != "gold sentences" else {})


def _sampling_params(cfg, source: str, **extra) -> CandidatesParams:
    """What sampling with the job's strategy uses: its keys, the seed, and the embedding model."""
    s = cfg.sampling
    embeds = s.strategy in EMBEDS
    return CandidatesParams(
        source=source, seed=cfg.seed, sampling=narrowed(s, _STRATEGY_USES[s.strategy]),
        embed_model=cfg.bi_encoder.model if embeds and s.ss_model != "gold_only" else None,
        max_length=cfg.bi_encoder.max_length if embeds else 128, use_gpu=cfg.training.use_gpu, **extra)


def _embedder_input(cfg) -> dict[str, str]:
    """The gold-only student, where it embeds the sentences for semantic search."""
    embeds = cfg.sampling.strategy in EMBEDS and cfg.sampling.ss_model == "gold_only"
    return {"embedder": "gold_only/model"} if embeds else {}


def _context(sentences: pa.Table | None, gold_keys: np.ndarray, params: CandidatesParams, env, embedder,
             hosts):
    """The ``SamplingContext`` of the job's strategy (``sentences`` None: filled in where it runs)."""
    from augsbert_ray.candidates import SamplingContext

    s = params.sampling
    bi = None
    if s.strategy in EMBEDS:
        if hosts is not None:
            bi = str(embedder) if embedder is not None else params.embed_model
        else:
            bi = env.ship(embedder) if embedder is not None else env.base_model(params.embed_model)
    return SamplingContext(
        sentences, gold_keys, s, env.out / "index", params.seed,
        bi_encoder=bi, max_length=params.max_length,
        cpus_per_actor=per_worker_cpus(None, env.cluster.cpus, s.searchers),
        gpus_per_actor=1 if params.use_gpu else 0, progress=env.reporter(), hosts=hosts,
    )


def _on_hosts(params: CandidatesParams, sentences: int, env):
    """The job's warm hosts if this sampling runs on them (``candidates.hosts.use_hosts``), else None."""
    from augsbert_ray.candidates.hosts import use_hosts

    # Hosts serve only on the driver's machine, where the models' files are: nothing to ship.
    hosts = env.hosts
    return hosts if use_hosts(params.sampling.executor, sentences, hosts is not None) else None


def _sample(sentences: pa.Table, gold_keys: np.ndarray, params: CandidatesParams, env, embedder) -> pa.Table:
    """The job's sampling strategy over ``sentences`` (pairs in ``gold_keys`` left out)."""
    from augsbert_ray.candidates import get_sampler

    s = params.sampling
    hosts = _on_hosts(params, sentences.num_rows, env)
    if hosts is not None:
        log.info(f"[candidates] sampling over {sentences.num_rows} sentences on a warm host "
                 f"(sampling.executor={s.executor})")
    return get_sampler(s.strategy)(_context(sentences, gold_keys, params, env, embedder, hosts))


def _write(env, sentences: pa.Table, candidates: pa.Table) -> None:
    from augsbert_ray.rundir import write_table

    write_table(env.out / "sentences.parquet", sentences)
    write_table(env.out / "candidates.parquet", candidates, schema.CANDIDATE_SCHEMA)


# -- the sources --------------------------------------------------------------------------------
def _gold_declare(cfg) -> Declaration:
    return Declaration(_sampling_params(cfg, "gold sentences"),
                       inputs={"gold": "gold/train.parquet", **_embedder_input(cfg)}, outputs=OUTPUTS)


def _gold_run(inputs, params: CandidatesParams, env) -> CandidatesResult:
    gold = inputs.table("gold")
    sentences = unique_sentences(gold)
    embedder = inputs.path("embedder") if "embedder" in inputs else None
    candidates = _sample(sentences, gold_pair_keys(gold, sentences), params, env, embedder)
    _write(env, sentences, candidates)
    log.info(f"[candidates] {candidates.num_rows} {params.sampling.strategy} pairs from {sentences.num_rows} "
             "sentences")
    return CandidatesResult(source=params.source, strategy=params.sampling.strategy, top_k=params.sampling.top_k,
                            sentences=sentences.num_rows, candidates=candidates.num_rows)


def _pairs_declare(cfg) -> Declaration:
    return Declaration(CandidatesParams(source="target pairs"), inputs={"pairs": "target/pairs.parquet"},
                       outputs=OUTPUTS)


def _pairs_run(inputs, params: CandidatesParams, env) -> CandidatesResult:
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
    log.info(f"[candidates] {candidates.num_rows} target pairs ({self_pairs} self-pairs and {repeats} repeated "
             f"pairs of {pairs.num_rows} left out) over {sentences.num_rows} sentences")
    return CandidatesResult(source=params.source, sentences=sentences.num_rows, candidates=candidates.num_rows,
                            target_pairs=pairs.num_rows, self_pairs_left_out=self_pairs, repeats_left_out=repeats)


def _corpus_declare(cfg) -> Declaration:
    from augsbert_ray.loaders.corpus import list_files

    # A corpus can be large: its files' names, sizes and modification times stand for its contents.
    return Declaration(_sampling_params(cfg, "target corpus", corpus=cfg.target.corpus), inputs=_embedder_input(cfg),
                       outputs=OUTPUTS, extra=list_files(cfg.target.corpus.path))


def _corpus_run(inputs, params: CandidatesParams, env) -> CandidatesResult:
    from augsbert_ray.candidates import off_driver, sharded
    from augsbert_ray.loaders.corpus import list_files, read_corpus

    files = list_files(params.corpus.path)
    embedder = inputs.path("embedder") if "embedder" in inputs else None
    if off_driver.wanted(files) and sharded.wanted(params.corpus, params.sampling.strategy) and _shared_folder(env):
        counts, n, candidates, where = _corpus_sharded(files, params, env, embedder)
    elif off_driver.wanted(files):
        counts, n, candidates, where = _corpus_off_driver(files, params, env, embedder)
    else:
        corpus = read_corpus(params.corpus, seed=params.seed, files=files)
        table = _sample(corpus.sentences, np.empty(0, np.int64), params, env, embedder)
        _write(env, corpus.sentences, table)
        counts, n, candidates, where = corpus.counts, corpus.sentences.num_rows, table.num_rows, ""
    log.info(f"[candidates] {candidates} {params.sampling.strategy} pairs from {n} corpus sentences{where}")
    return CandidatesResult(source=params.source, strategy=params.sampling.strategy, top_k=params.sampling.top_k,
                            sentences=n, candidates=candidates, corpus_files=len(files), corpus_lines=counts)


def _corpus_off_driver(files, params: CandidatesParams, env, embedder) -> tuple[dict, int, int, str]:
    """A large corpus read and sampled in tasks of their own (``candidates.off_driver``): its line
    counts, sentences, candidate pairs, and where the work ran (for the log line)."""
    import pyarrow.parquet as pq

    from augsbert_ray.candidates import off_driver

    counts, n, read_pid = off_driver.run(off_driver.read_to_file, params.corpus, params.seed, files, str(env.out))
    if _on_hosts(params, n, env) is not None:  # a large file of few distinct sentences: they are small enough to pass
        from augsbert_ray.rundir import write_table

        table = _sample(pq.read_table(env.out / "sentences.parquet"), np.empty(0, np.int64), params, env, embedder)
        write_table(env.out / "candidates.parquet", table, schema.CANDIDATE_SCHEMA)  # the task wrote the sentences
        return counts, n, table.num_rows, f" (read in a worker process, pid {read_pid})"
    ctx = _context(None, np.empty(0, np.int64), params, env, embedder, hosts=None)
    candidates, sample_pid = off_driver.run(off_driver.sample_to_file, ctx, str(env.out))
    return counts, n, candidates, f" (read and sampled in worker processes, pids {read_pid} and {sample_pid})"


def _shared_folder(env) -> bool:
    """Whether Ray tasks on every node read and write the stage's folder: one node, or a run directory
    on a mounted file system (the cluster's must be shared). A storage URI is staged on the driver's
    disk, so a cluster of several nodes keeps the single-task path there."""
    from augsbert_ray.rundir import is_uri

    storage = getattr(env, "storage", None)
    return env.cluster.nodes <= 1 or storage is None or not is_uri(storage)


def _corpus_sharded(files, params: CandidatesParams, env, embedder) -> tuple[dict, int, int, str]:
    """A large corpus deduplicated into sentence parts and sampled over them in Ray Data tasks
    (``candidates.corpus_shards``, ``candidates.sharded``): its line counts, sentences, candidate
    pairs, and how (for the log line)."""
    import pyarrow.parquet as pq

    from augsbert_ray.candidates import off_driver
    from augsbert_ray.candidates.corpus_shards import shard_corpus
    from augsbert_ray.candidates.sharded import concat_parts, sample_parts

    parts = shard_corpus(params.corpus, files, env.out, seed=params.seed)
    off_driver.run(concat_parts, [str(p) for p in parts.parts], str(env.out / "sentences.parquet"),
                   schema.SENTENCE_SCHEMA)
    how = f" (deduplicated and sampled on {len(parts.parts)} sentence parts)"
    if _on_hosts(params, parts.sentences, env) is not None:  # few distinct sentences: small enough to pass
        from augsbert_ray.rundir import write_table

        table = _sample(pq.read_table(env.out / "sentences.parquet"), np.empty(0, np.int64), params, env, embedder)
        write_table(env.out / "candidates.parquet", table, schema.CANDIDATE_SCHEMA)
        return parts.counts, parts.sentences, table.num_rows, " (deduplicated on sentence parts)"
    ctx = _context(None, np.empty(0, np.int64), params, env, embedder, hosts=None)
    return parts.counts, parts.sentences, sample_parts(ctx, parts, env.out), how


# source name -> (declare(cfg), run(inputs, params, env))
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
    result_type = CandidatesResult
    publishes = {name: name for name in OUTPUTS}

    def throughput(self, result: CandidatesResult, seconds: float) -> str:
        if not seconds:
            return ""
        return (f"{result.candidates / seconds:.1f} candidate pairs/s "
                f"({result.sentences / seconds:.1f} sentences/s)")

    def __init__(self, source: str):
        if source not in SOURCES:
            raise ValueError(f"unknown candidate source '{source}'; valid: {', '.join(SOURCES)}")
        self.source = source

    def declare(self, cfg) -> Declaration:
        decl = SOURCES[self.source][0](cfg)
        return Declaration(decl.params, inputs=decl.inputs, outputs=decl.outputs, extra=[self.source, decl.extra])

    def run(self, inputs, params: CandidatesParams, env) -> CandidatesResult:
        return SOURCES[params.source][1](inputs, params, env)
