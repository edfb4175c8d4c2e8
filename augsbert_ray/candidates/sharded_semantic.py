"""Semantic search (``ss``) over a corpus's sentence parts: no process holds all the embeddings.

The single-process sampler (``semantic.sample``) embeds every sentence into one array and
searches one Faiss index over it. Here three rounds of Ray work do the same over bounded
slices, with files in the stage's folder between them (on several nodes, storage that they all
read and write, as ``sharded`` requires):

1. **embed**: a Ray Data actor pool of ``sampling.searchers`` bi-encoders
   (``semantic.SentenceEmbedder``, with the resources of the single-process pool) embeds the
   sentences a block at a time, each actor reading its block from the sentence parts, and writes
   the block's embeddings as ``NNNNN.npy``. Block ``j`` holds the ids from ``j * B`` on, ``B``
   a multiple of ``sampling.query_batch_size`` near ``corpus_shards.QUERY_BLOCK``, embedded in
   batches of ``sampling.query_batch_size`` sentences from its first id: the batches of the
   single-process pool, so the same embeddings to the bit (sentence-transformers sorts a batch
   by length and pads it, so a sentence's floats depend on the batch it is in).
2. **index**: one task per index shard (consecutive blocks, at most ``INDEX_BYTES`` of vectors)
   builds the shard's Faiss index (``semantic.build_faiss_index``, ``sampling.faiss``, the seed
   plus the shard's number) and writes it to ``<work_dir>/faiss/shard-NNNNN.faiss``: built
   once, read by every search.
3. **search**: one Ray Data task per block (``sampling.faiss.shard_cpus`` and ``shard_gpus``)
   searches the block's ``top_k + 1`` neighbours in each index shard, one shard at a time,
   merges the lists as one index lists them (``semantic.merge_top_k``, ties included), drops
   the query itself (``semantic.top_k_others``) and writes the hits into ``sharded``'s pair
   buckets.

With a flat index (the default) the pairs are those of the single-process sampler, up to float
ties. Faiss computes a block's scores with BLAS on other matrix shapes and threads than one
search of every sentence, which can change a score in its last bits, and with it the order of
two neighbours whose cosines are that close (a few pairs in a hundred thousand sentences; none
on the tests' corpora, where the scores too are equal to the bit). IVF and HNSW shards are each
approximate, as with ``sampling.faiss.shards``.

What a process holds: an embedding actor, its model and one block; an index task, one shard's
vectors (twice, while Faiss copies them); a search task, one block's embeddings and top lists,
and one index shard at a time mapped from storage (in the node's page cache, which the tasks
share). The embeddings are removed after the search; the index shards stay in the stage's
folder, as the BM25 index does.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from augsbert_ray import schema
from augsbert_ray.candidates import corpus_shards
from augsbert_ray.candidates.corpus_shards import FOUND, NODE, WRITTEN, SentenceParts, check_found, each, node_id

log = logging.getLogger(__name__)

INDEX_BYTES = 256 << 20  # vectors per index shard, in bytes: what an index or search task holds of the index


def block_rows(step: int) -> int:
    """Sentences per embedding and query block: a multiple of the embedding batch ``step``
    (``sampling.query_batch_size``) near ``corpus_shards.QUERY_BLOCK`` (pure)."""
    return step * max(1, round(corpus_shards.QUERY_BLOCK / step))


def _row_groups(parts: SentenceParts) -> list[tuple[str, int, int, int]]:
    """Every row group of the sentence parts: ``(path, group, first id, rows)``, in id order."""
    groups = []
    for p, first in zip(parts.parts, parts.offsets):
        meta = pq.ParquetFile(p).metadata
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            groups.append((str(p), g, first, rows))
            first += rows
    return groups


def _read_ids(groups: list[tuple[str, int, int, int]], start: int, end: int) -> pa.Table:
    """The sentences with ids ``start`` to ``end - 1``, read from the row groups that hold them."""
    firsts = np.asarray([g[2] for g in groups])
    pieces = []
    for path, g, first, rows in groups[max(0, np.searchsorted(firsts, start, side="right") - 1):]:
        if first >= end:
            break
        lo, hi = max(start, first), min(end, first + rows)
        if hi > lo:
            pieces.append(pq.ParquetFile(path).read_row_group(g, use_threads=False).slice(lo - first, hi - lo))
    table = pa.concat_tables(pieces) if pieces else schema.SENTENCE_SCHEMA.empty_table()
    if not np.array_equal(table.column(schema.SENTENCE_ID).to_numpy(), np.arange(start, end)):
        raise RuntimeError(f"the sentence parts do not hold ids {start} to {end - 1} in order")
    return table


def _save(path: Path, array: np.ndarray) -> None:
    """An array written under a temporary name, then renamed (a retried task rewrites it whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    tmp.replace(path)


def _matrix(table: pa.Table) -> np.ndarray:
    from augsbert_ray.candidates.semantic import EMBEDDING

    column = table.column(EMBEDDING).combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False).reshape(-1, column.type.list_size)


class _EmbedBlocks:
    """Ray Data callable: the bi-encoder loaded once; a block's embeddings written to ``folder``."""

    def __init__(self, groups, rows: int, n: int, folder: str, step: int, **embedder):
        from augsbert_ray.candidates.semantic import SentenceEmbedder

        self.embedder = SentenceEmbedder(**embedder)
        self.groups, self.rows, self.n, self.folder, self.step = groups, rows, n, Path(folder), step

    def __call__(self, item: pa.Table) -> pa.Table:
        j = item.column("index")[0].as_py()
        sentences = _read_ids(self.groups, j * self.rows, min(self.n, (j + 1) * self.rows))
        emb = np.concatenate([_matrix(self.embedder(sentences.slice(at, self.step)))
                              for at in range(0, sentences.num_rows, self.step)])
        _save(self.folder / f"{j:05d}.npy", np.ascontiguousarray(emb, dtype=np.float32))
        return pa.table({"index": [j], "rows": [len(emb)], "dim": [emb.shape[1]]})


def _shard_path(index_dir: str, s: int) -> Path:
    return Path(index_dir) / f"shard-{s:05d}.faiss"


def _build_shard(batch: pa.Table, folder: str, index_dir: str, shards: list[list[int]], fcfg, seed: int) -> pa.Table:
    """Task, one index shard: its blocks' vectors indexed and written; how many blocks it found."""
    import faiss

    from augsbert_ray.candidates.semantic import build_faiss_index

    s = batch.column("index")[0].as_py()
    files = [Path(folder) / f"{j:05d}.npy" for j in shards[s]]
    found = sum(f.exists() for f in files)
    if found < len(files):  # the driver says which storage is missing
        return pa.table({"index": [s], FOUND: [found]})
    emb = np.concatenate([np.load(f, mmap_mode="r") for f in files])
    index = build_faiss_index(emb, fcfg.model_copy(update={"use_gpu": False}), seed + s)  # written from the CPU
    del emb
    path = _shard_path(index_dir, s)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(path)
    return pa.table({"index": [s], FOUND: [found]})


def _open_shard(path: Path, fcfg):
    """An index shard mapped from storage (on a GPU where ``fcfg`` asks for one and there is one).

    Mapped, not read: the task holds no copy of the vectors (IVF: of its inverted lists), which
    the node's page cache serves to every task that searches the shard. The search settings
    (``ivf_nprobe``, ``hnsw_ef_search``) are stored in the index."""
    import faiss

    from augsbert_ray.candidates.semantic import _on_gpu

    index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP if fcfg.index == "ivf" else faiss.IO_FLAG_MMAP_IFC)
    return _on_gpu(index) if fcfg.use_gpu else index


def _search_block(batch: pa.Table, folder: str, index_dir: str, starts: list[int], rows: int, k: int, fcfg,
                  work: str, offsets: list[int]) -> pa.Table:
    """Ray Data task, one block: its queries' ``k`` nearest other sentences over every index shard
    (``starts``: each shard's first id), spilled into the pair buckets."""
    from augsbert_ray.candidates.semantic import merge_top_k, top_k_others
    from augsbert_ray.candidates.corpus_shards import spill_hits

    j = batch.column("index")[0].as_py()
    files = [Path(folder) / f"{j:05d}.npy", *(_shard_path(index_dir, s) for s in range(len(starts)))]
    found = sum(f.exists() for f in files)
    if found < len(files):
        return pa.table({"index": [j], FOUND: [found], WRITTEN: ["[]"], NODE: [node_id()]})
    queries = np.load(files[0])
    top = np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
    for path, first in zip(files[1:], starts):
        index = _open_shard(path, fcfg)
        scores, ids = index.search(queries, min(k + 1, index.ntotal))
        top = merge_top_k([top, (scores, np.where(ids >= 0, ids + first, -1))], k + 1)
        del index
    q, h, s = top_k_others(j * rows + np.arange(len(queries), dtype=np.int64), *top, k)
    hits = pa.table({"query_id": pa.array(q, pa.int64()), "hit_id": pa.array(h, pa.int64()),
                     "score": pa.array(s, pa.float32())}, schema=schema.HITS_SCHEMA)
    spilled = spill_hits(hits, work, j * rows, offsets)
    return pa.table({"index": [j], FOUND: [found], WRITTEN: spilled.column(WRITTEN), NODE: spilled.column(NODE)})


def _embed(ctx, parts: SentenceParts, folder: Path, rows: int, blocks: int) -> int:
    """Round 1: every block embedded and written to ``folder``; the embeddings' dimension."""
    import ray
    from ray.data import ActorPoolStrategy

    from augsbert_ray.runtime import require_resources

    cfg = ctx.cfg
    require_resources([{"CPU": ctx.cpus_per_actor, "GPU": ctx.gpus_per_actor}] * cfg.searchers,
                      "embedding sentences for semantic search (sampling.searchers, training.use_gpu)")
    embedder = {"model_path": ctx.bi_encoder, "max_length": ctx.max_length, "batch_size": cfg.embed_batch_size,
                "threads": ctx.cpus_per_actor, "use_gpu": ctx.gpus_per_actor > 0, "progress": ctx.progress}
    done = ray.data.from_items([{"index": j} for j in range(blocks)], override_num_blocks=blocks).map_batches(
        _EmbedBlocks, batch_size=1, batch_format="pyarrow", compute=ActorPoolStrategy(size=cfg.searchers),
        num_cpus=ctx.cpus_per_actor, num_gpus=ctx.gpus_per_actor,
        fn_constructor_kwargs={"groups": _row_groups(parts), "rows": rows, "n": parts.sentences,
                               "folder": str(folder), "step": cfg.query_batch_size, **embedder}).take_all()
    dims = {r["dim"] for r in done}
    if sum(r["rows"] for r in done) != parts.sentences or len(dims) != 1:
        raise RuntimeError(f"embedding returned {sum(r['rows'] for r in done)} rows of dimensions {sorted(dims)} "
                           f"for {parts.sentences} sentences")
    return dims.pop()


def semantic_hits(ctx, parts: SentenceParts, blocks: list[dict], work: Path) -> list[dict]:
    """Semantic search's top-k of every sentence of ``parts``, spilled into ``work``'s pair buckets
    (``corpus_shards.spill_hits``); the search tasks' rows.

    Args:
        ctx: a ``SamplingContext`` without its sentences: its settings, seed, bi-encoder, the
            embedding actors' resources, progress and ``work_dir`` (where the index shards go).
        parts: the corpus's sentence parts.
        blocks: ``sharded``'s query blocks (row groups of the parts); unused, as the embedding
            blocks start at multiples of the embedding batch instead.
        work: the hits' folder; the embeddings go to ``work / "embeddings"`` meanwhile.
    """
    import ray

    from augsbert_ray.runtime import require_resources

    cfg, fcfg, n = ctx.cfg, ctx.cfg.faiss, parts.sentences
    folder, index_dir = Path(work) / "embeddings", Path(ctx.work_dir) / "faiss"
    for f in (folder, index_dir):
        shutil.rmtree(f, ignore_errors=True)
    if n == 0:
        return []
    rows = block_rows(cfg.query_batch_size)
    count = math.ceil(n / rows)
    dim = _embed(ctx, parts, folder, rows, count)
    per_shard = max(1, INDEX_BYTES // (4 * dim * rows))
    shards = [list(range(s, min(s + per_shard, count))) for s in range(0, count, per_shard)]
    log.info(f"[candidates] semantic search on shards: {count} blocks of up to {rows:,} sentences, "
             f"{len(shards)} index shards ({fcfg.index}) of up to {per_shard * rows:,} vectors of {dim} floats")
    built = each(list(range(len(shards))), _build_shard, folder=str(folder), index_dir=str(index_dir), shards=shards,
                 fcfg=fcfg, seed=ctx.seed)
    check_found(built, [len(s) for s in shards], folder)
    require_resources([{"CPU": fcfg.shard_cpus, "GPU": fcfg.shard_gpus}],
                      "semantic search on shards (sampling.faiss.shard_cpus, shard_gpus)")
    searched = ray.data.from_items([{"index": j} for j in range(count)], override_num_blocks=count).map_batches(
        _search_block, batch_size=1, batch_format="pyarrow", num_cpus=fcfg.shard_cpus, num_gpus=fcfg.shard_gpus,
        fn_kwargs={"folder": str(folder), "index_dir": str(index_dir), "starts": [s[0] * rows for s in shards],
                   "rows": rows, "k": cfg.top_k, "fcfg": fcfg, "work": str(work), "offsets": parts.offsets}).take_all()
    check_found(searched, [1 + len(shards)] * count, folder)
    shutil.rmtree(folder, ignore_errors=True)
    return [{WRITTEN: r[WRITTEN], NODE: r[NODE]} for r in searched]
