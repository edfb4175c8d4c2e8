"""Candidate pairs over a corpus's sentence parts (``corpus_shards``), no process holding them all.

The samplers' own code, run on shards:

- **queries** run as Ray Data tasks over the sentence parts, a row group of a part
  (``corpus_shards.QUERY_BLOCK`` sentences) at a time, which the task reads itself: random draws
  (``rs``, ``kde``) in plain tasks, BM25 (``bm25``, ``bm25-kde``) in a pool of
  ``sampling.searchers`` actors that open one Tantivy index, built once from the parts (by one
  task that streams them) in the stage's folder, where every node reads it; semantic search
  (``ss``) embeds the parts and searches Faiss index shards on storage (``sharded_semantic``).
  Each block's hits are written to storage at once, split by pair bucket: a pair belongs to the
  sentence part that holds its smaller id;
- **pairs**: one Ray Data task per bucket reads its hits and applies ``pairs.finalize_candidates``'
  rules (``pairs.unique_pairs``); ``bm25+ss`` searches both ways and the task takes the union of
  the two samplers' pairs as ``combined.union_candidates`` does (``combined.union_pairs``). It
  fetches the two texts of each pair from the sentence parts (its own, then each other part its
  pairs name, one at a time) and writes ``candidates.parts/part-NNNNN.parquet``, sorted by
  (id1, id2);
- the parts, in order, are ``candidates.parquet`` (the file the labelling stage reads), copied a
  row group at a time by a task on the driver's node; ``sentences.parquet`` likewise.

The pairs are those of the sampler over the whole sentence table: the same sentence ids,
the same per-sentence draws, the same BM25 index (its documents added in id order), the same
embeddings and nearest neighbours (``sharded_semantic``: exact with a flat index, up to ties
that float rounding makes or breaks).

What grows with the corpus, and where: the sentence parts, the hits and the candidate parts
(storage); the Tantivy index (storage, and the page cache of the nodes whose searchers read it);
the embeddings (removed after the search) and the Faiss index shards (storage); the driver's
lists of parts and blocks (a few bytes per part). A task holds one block of queries, one
bucket's pairs and one sentence part at a time; a search task, one index shard at a time.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from augsbert_ray import schema
from augsbert_ray.candidates.corpus_shards import (FOUND, NODE, SentenceParts, check_found, each, spill_hits,
                                                   expected_files, node_id, nodes_of, on_nodes, part_path,
                                                   write_atomic)

log = logging.getLogger(__name__)

ROW_GROUP = 65_536  # rows per row group of the files written (``rundir.write_table``'s slices)

# Strategies sampled on shards (every one the samplers' registry has).
SHARDED = frozenset({"rs", "kde", "bm25", "bm25-kde", "ss", "bm25+ss"})

# A large corpus takes the sharded path wherever it applies (``wanted``); False keeps the single
# task of ``off_driver``, which benchmarks/corpus_scale.py measures beside it.
ENABLED = True


def wanted(corpus_cfg, strategy: str) -> bool:
    """Whether a large corpus (``off_driver.wanted``) is read and sampled on shards (pure)."""
    from augsbert_ray.candidates.corpus_shards import FORMATS

    return ENABLED and corpus_cfg.format in FORMATS and strategy in SHARDED


def _block(item: pa.Table, columns: list[str] | None = None) -> tuple[pa.Table, int]:
    """The sentences of a query block (``{"path", "group"}``: a row group of a part), and the id
    that names its files: blocks hold disjoint sentences, and a retried block rewrites the same files."""
    row = item.to_pylist()[0]
    sentences = pq.ParquetFile(row["path"]).read_row_group(row["group"], columns=columns, use_threads=False)
    return sentences, int(sentences.column(schema.SENTENCE_ID)[0].as_py())


def _draw(item: pa.Table, n_sentences: int, k: int, seed: int, progress, work: str, offsets: list[int]) -> pa.Table:
    """Ray Data task: the random partners of a block of sentences, spilled."""
    from augsbert_ray.candidates.random_pairs import draw_batch

    batch, first = _block(item, [schema.SENTENCE_ID])
    hits = draw_batch(batch, n_sentences, k, seed, progress)
    return spill_hits(hits, work, first, offsets)


class _Search:
    """Ray Data callable: a BM25 searcher over the shared index; a block's hits, spilled."""

    def __init__(self, index_dir: str, top_k: int, progress, work: str, offsets: list[int], step: int):
        from augsbert_ray.candidates.bm25 import BM25Searcher

        self.searcher = BM25Searcher(index_dir, top_k, progress)
        self.work, self.offsets, self.step = work, offsets, max(1, step)

    def __call__(self, item: pa.Table) -> pa.Table:
        batch, first = _block(item)
        hits = pa.concat_tables([self.searcher(batch.slice(at, self.step))
                                 for at in range(0, batch.num_rows, self.step)] or [self.searcher(batch)])
        return spill_hits(hits, self.work, first, self.offsets)


def _texts(parts: SentenceParts, b: int) -> pa.Array:
    return pq.read_table(part_path(parts.folder, b), columns=[schema.TEXT]).column(0).combine_chunks()


def _bucket_keys(work: str, b: int, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One sampler's hits in bucket ``b``: its pairs' sorted keys, their best scores, and how many
    files it read."""
    from augsbert_ray.candidates.pairs import unique_pairs

    folder = Path(work) / f"{b:05d}"
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    hits = pa.concat_tables([pq.read_table(f) for f in files]) if files else schema.HITS_SCHEMA.empty_table()
    keys, scores = unique_pairs(hits.column("query_id").to_numpy(), hits.column("hit_id").to_numpy(),
                                hits.column("score").to_numpy(), n, np.empty(0, np.int64))
    return keys, scores, len(files)


def _pair_bucket(batch: pa.Table, sources: list[tuple[str, str]], parts: SentenceParts, out: str) -> pa.Table:
    """Ray Data task, one pair bucket: the hits of each of ``sources`` (``(origin, hits folder)``,
    in priority order) as candidate rows (``schema.CANDIDATE_SCHEMA``); several: their union."""
    from augsbert_ray.candidates.combined import union_pairs

    b, n, offsets = batch.column("index")[0].as_py(), parts.sentences, np.asarray(parts.offsets)
    found = [(origin, *_bucket_keys(work, b, n)) for origin, work in sources]
    if len(found) == 1:
        origin, keys, scores, _ = found[0]
        origins = pa.array([origin] * len(keys), pa.string())
    else:
        keys, scores, origins = union_pairs([(origin, k, s) for origin, k, s, _ in found])
    id1, id2 = keys // n, keys % n
    text1 = _texts(parts, b).take(pa.array(id1 - offsets[b])) if len(keys) else pa.array([], pa.string())
    order = np.argsort(id2, kind="stable")
    sorted2 = id2[order]
    cuts = np.searchsorted(sorted2, offsets)
    chunks = [_texts(parts, c).take(pa.array(sorted2[lo:hi] - offsets[c]))
              for c, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])) if hi > lo]
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    text2 = pa.concat_arrays(chunks).take(pa.array(inverse)) if chunks else pa.array([], pa.string())
    table = pa.table({schema.ID1: pa.array(id1, pa.int64()), schema.ID2: pa.array(id2, pa.int64()),
                      schema.SENTENCE1: text1, schema.SENTENCE2: text2,
                      schema.ORIGIN: origins,
                      schema.RETRIEVAL_SCORE: pa.array(scores, pa.float32())})
    write_atomic(part_path(Path(out), b), table.cast(schema.CANDIDATE_SCHEMA), ROW_GROUP)
    for _, work in sources:
        shutil.rmtree(Path(work) / f"{b:05d}", ignore_errors=True)
    return pa.table({"index": [b], "rows": [table.num_rows], FOUND: [sum(f[-1] for f in found)],
                     NODE: [node_id()]})


def concat_parts(parts: list[str], out: str, target_schema: pa.Schema, row_group: int = ROW_GROUP) -> int:
    """Task: the Parquet ``parts``, in order, as one file ``out`` in row groups of ``row_group``
    rows, read a row group at a time (written under a temporary name, then renamed); its rows."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    rows, pending, held = 0, [], 0
    with pq.ParquetWriter(tmp, target_schema) as writer:
        for path in parts:
            reader = pq.ParquetFile(path)
            for g in range(reader.metadata.num_row_groups):
                pending.append(reader.read_row_group(g, use_threads=False).cast(target_schema))
                held += pending[-1].num_rows
                while held >= row_group:
                    whole = pa.concat_tables(pending)
                    writer.write_table(whole.slice(0, row_group))
                    rows += row_group
                    pending, held = [whole.slice(row_group)], held - row_group
        if held or not rows:
            writer.write_table(pa.concat_tables(pending) if pending else target_schema.empty_table())
            rows += held
    tmp.replace(out)
    return rows


def _build_index(parts: list[str], index_dir: str) -> str:
    """Task: the BM25 index over the sentence parts, read one at a time, in id order."""
    from augsbert_ray.candidates.bm25 import build_index

    return str(build_index((pq.read_table(p) for p in parts), Path(index_dir)))


def _random_hits(ctx, parts: SentenceParts, blocks: list[dict], work: Path) -> list[dict]:
    """Random partners (``rs``, ``kde``) of every block, spilled into ``work``; the tasks' rows."""
    import ray

    cfg = ctx.cfg
    k = cfg.random_per_sentence if cfg.strategy == "rs" else cfg.kde.pool_per_sentence
    if not blocks:
        return []
    return ray.data.from_items(blocks, override_num_blocks=len(blocks)).map_batches(
        _draw, batch_size=1, batch_format="pyarrow", num_cpus=1,
        fn_kwargs={"n_sentences": parts.sentences, "k": k, "seed": ctx.seed, "progress": ctx.progress,
                   "work": str(work), "offsets": parts.offsets}).take_all()  # a row per block: a few bytes


def _bm25_hits(ctx, parts: SentenceParts, blocks: list[dict], work: Path) -> list[dict]:
    """BM25's top-k of every block, spilled into ``work``; the searchers' rows."""
    import ray
    from ray.data import ActorPoolStrategy

    from augsbert_ray.candidates import off_driver
    from augsbert_ray.runtime import require_resources

    cfg = ctx.cfg
    require_resources([{"CPU": 1}] * cfg.searchers, "BM25 search (sampling.searchers, one CPU each)")
    index_dir = off_driver.run(_build_index, [str(p) for p in parts.parts], str(Path(ctx.work_dir) / "bm25_index"))
    if not blocks:
        return []
    return ray.data.from_items(blocks, override_num_blocks=len(blocks)).map_batches(
        _Search, batch_size=1, batch_format="pyarrow", num_cpus=1, compute=ActorPoolStrategy(size=cfg.searchers),
        fn_constructor_kwargs={"index_dir": index_dir, "top_k": cfg.top_k, "progress": ctx.progress,
                               "work": str(work), "offsets": parts.offsets, "step": cfg.query_batch_size}).take_all()


def sample_parts(ctx, parts: SentenceParts, out: Path) -> int:
    """The job's sampler (``ctx.cfg.strategy``, one of ``SHARDED``) over ``parts``; writes
    ``out / "candidates.parts"`` and ``out / "candidates.parquet"``; returns the number of pairs.

    Args:
        ctx: a ``SamplingContext`` without its sentences (its settings, seed, progress, work_dir,
            and for ``ss`` and ``bm25+ss`` the bi-encoder and its actors' resources).
        parts: the corpus's sentence parts (``corpus_shards.shard_corpus``).
        out: the stage's folder.

    Raises:
        ValueError: a strategy not in ``SHARDED``, or semantic search without a bi-encoder.
    """
    from augsbert_ray.candidates import off_driver
    from augsbert_ray.candidates.sharded_semantic import semantic_hits

    cfg, n = ctx.cfg, parts.sentences
    if cfg.strategy not in SHARDED:
        raise ValueError(f"sampling strategy '{cfg.strategy}' is not sampled on shards; sharded: "
                         f"{', '.join(sorted(SHARDED))}")
    if cfg.strategy in ("ss", "bm25+ss") and ctx.bi_encoder is None:  # before any search starts
        raise ValueError(f"{cfg.strategy} sampling needs a bi-encoder: SamplingContext.bi_encoder is None")
    work, folder = Path(out) / "_hits", Path(out) / "candidates.parts"
    for f in (work, folder):
        shutil.rmtree(f, ignore_errors=True)
    # One item per row group: the tasks read their sentences themselves, so no read task waits
    # for a CPU that the searchers hold.
    blocks = [{"path": str(p), "group": g}
              for p in parts.parts for g in range(pq.ParquetFile(p).metadata.num_row_groups)]
    # (origin, hits folder, the rows of the tasks that spilled them), in union_candidates' priority order
    searches = {"rs": [("rs", _random_hits)], "kde": [("kde", _random_hits)], "bm25": [("bm25", _bm25_hits)],
                "bm25-kde": [("bm25", _bm25_hits)], "ss": [("ss", semantic_hits)],
                "bm25+ss": [("bm25", _bm25_hits), ("ss", semantic_hits)]}
    sources = []
    for origin, hits in searches[cfg.strategy]:
        if ctx.progress is not None:  # every sentence is searched once per sampler, as on one machine
            ctx.progress.add_total(n, unit="sentences")
        sources.append((origin, work / origin, hits(ctx, parts, blocks, work / origin)))
    buckets = list(range(len(parts.parts)))
    rows = each(buckets, _pair_bucket, sources=[(o, str(w)) for o, w, _ in sources], parts=parts, out=str(folder))
    expected = np.sum([expected_files(spilled, len(buckets)) for _, _, spilled in sources], axis=0).tolist()
    check_found(rows, expected, work)
    nodes = {"query": nodes_of([r for _, _, spilled in sources for r in spilled]), "pairs": nodes_of(rows)}
    log.info(f"[candidates] {len(blocks)} query blocks {on_nodes(nodes['query'])}, {len(buckets)} pair buckets "
             f"{on_nodes(nodes['pairs'])}", extra={"task_nodes": nodes})
    shutil.rmtree(work, ignore_errors=True)
    pair_parts = [str(part_path(folder, b)) for b in buckets]
    written = off_driver.run(concat_parts, pair_parts, str(Path(out) / "candidates.parquet"), schema.CANDIDATE_SCHEMA)
    if written != sum(r["rows"] for r in rows):
        raise RuntimeError(f"candidates.parquet has {written} rows, its parts {sum(r['rows'] for r in rows)}")
    return written
