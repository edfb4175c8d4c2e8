"""A large corpus's distinct sentences, made by Ray Data tasks as shards on storage.

No process holds the corpus: four rounds of tasks, each over a bounded slice of it, write
their results as Parquet files under ``work`` (the stage's folder; on a cluster of several
nodes it must be storage every node reads and writes, as the run directory is).

1. **read**: one task per slice of the corpus (``read_tasks``) cleans its lines as
   ``read_corpus`` does, counts them, and writes the kept texts, each with its position in the
   corpus, into hash shards (a text's shard is a stable hash of the text, so every copy of a
   sentence lands in the same shard). A slice is a byte range (``loaders.corpus.RANGE_BYTES``)
   of a ``lines``, ``jsonl`` or TSV file (whose rows are lines), a row group of a Parquet file,
   or a whole CSV file (a quoted value may hold a newline, so no byte offset is known to start
   a row) or a compressed CSV or TSV file, which one task streams in row batches with the
   reader Ray Data uses. A position is a read unit's index and a line's index in it; a streamed file's rows
   fill consecutive units of about ``RANGE_BYTES`` of text each.
2. **dedup**: one task per hash shard keeps each text once, at its first position, and writes
   it back by the read unit of that position, counting them.
3. **number**: a sentence's id is the number of distinct texts that first appear before it:
   those of the earlier read units (the driver sums the counts), then its rank within its own
   unit. One task per unit sorts its first appearances and writes ``part-NNNNN.parquet``
   (a unit with none makes no part).

The ids are therefore those of ``read_corpus`` (order of first appearance, and the same seeded
``max_sentences`` sample), whatever the cluster's size or the number of shards: the samplers
find the same pairs. What the driver keeps grows with the number of read units and shards (a
few integers each), not the lines; with ``max_sentences``, the ids kept (8 bytes each) are drawn
on the driver, as ``read_corpus`` draws them, and reach the tasks through the object store.
Every task's row names the node it ran on; the driver logs how many nodes each round used.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from augsbert_ray import schema

log = logging.getLogger(__name__)

SHARD_BYTES = 32 << 20  # corpus bytes per hash shard: what one dedup task holds, about
QUERY_BLOCK = 16_384  # sentences per row group of a part: one query task's block (``sharded``)
WRITTEN, FOUND = "written", "found"  # a task's row: which folders it wrote a file to; how many files it read
POS = "pos"  # a line's position: its read unit's index << 32 | its line's index in the unit
NODE = "node"  # a task's row: the node it ran on
FORMATS = ("lines", "jsonl", "tsv", "csv", "parquet")  # every corpus format
RANGE, GROUP, STREAM = "range", "group", "stream"  # how a read task takes its slice (``read_tasks``)
COMPRESSION = 32  # the text a compressed file holds per byte, at most, for its read units (``_streamed_units``)


@dataclass
class SentenceParts:
    """The corpus's distinct sentences as id-ordered Parquet parts (``schema.SENTENCE_SCHEMA``)."""

    folder: Path
    sentences: int
    offsets: list[int]  # part ``p`` holds ids ``offsets[p]`` to ``offsets[p + 1] - 1``
    counts: dict = field(default_factory=dict)  # what happened to every line (as ``read_corpus``)
    nodes: dict = field(default_factory=dict)  # round -> the ids of the nodes its tasks ran on

    @property
    def parts(self) -> list[Path]:
        return [part_path(self.folder, p) for p in range(len(self.offsets) - 1)]


def part_path(folder: Path, b: int) -> Path:
    return Path(folder) / f"part-{b:05d}.parquet"


def write_atomic(path: Path, table: pa.Table, row_group: int = 65_536) -> None:
    """A Parquet file written under a temporary name, then renamed: a retried task rewrites it
    whole, and a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, row_group_size=row_group)
    tmp.replace(path)


def _stable_hash(texts: pa.Array) -> np.ndarray:
    """A hash of each text that every process computes alike (Python's ``hash`` is salted per process)."""
    import pandas as pd

    return pd.util.hash_array(texts.to_numpy(zero_copy_only=False)).astype(np.uint64)


def _first_positions(texts: pa.Array, pos: np.ndarray) -> pa.Table:
    """Each distinct text once, with its smallest position."""
    t = pa.table({schema.TEXT: texts, POS: pa.array(pos, pa.int64())})
    return t.group_by(schema.TEXT).aggregate([(POS, "min")]).rename_columns([schema.TEXT, POS])


def node_id() -> str:
    """The id of the node this process runs on ("" outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def spill_hits(hits: pa.Table, work: str, first_id: int, offsets: list[int]) -> pa.Table:
    """Writes a block of query hits (``schema.HITS_SCHEMA``) into their pair buckets; the task's row."""
    q, h = hits.column("query_id").to_numpy(), hits.column("hit_id").to_numpy()
    which = np.searchsorted(np.asarray(offsets), np.minimum(q, h), side="right") - 1
    written = np.unique(which).tolist()
    for b in written:
        write_atomic(Path(work) / f"{b:05d}" / f"{first_id:012d}.parquet", hits.filter(pa.array(which == b)))
    return pa.table({WRITTEN: [json.dumps(written)], NODE: [node_id()]})


def nodes_of(rows: list[dict]) -> list[str]:
    """The nodes that a round's tasks ran on, from their rows."""
    return sorted({r[NODE] for r in rows if r.get(NODE)})


def on_nodes(nodes: list[str]) -> str:
    return f"on {len(nodes)} node{'' if len(nodes) == 1 else 's'}"


def _compressed(path: str) -> bool:
    """Whether a file's name says it is compressed (as Ray Data's readers infer it)."""
    try:
        pa.Codec.detect(path)
    except (TypeError, ValueError):
        return False
    return True


def _row_groups(path: str) -> int:
    from augsbert_ray.loaders import corpus as loader

    fs, p = loader._filesystem(path)
    with fs.open_input_file(p) as f:
        return pq.ParquetFile(f).metadata.num_row_groups


def read_tasks(cfg, files: list[tuple], range_bytes: int) -> tuple[list[dict], int]:
    """Round 1's tasks in corpus order, and how many read units they fill (a unit is one part's
    worth of the corpus: a byte range, a row group, or about ``range_bytes`` of a streamed file's text).

    Raises:
        DataError: a CSV, TSV or Parquet file without the column (as ``read_corpus``).
    """
    from augsbert_ray.loaders import corpus as loader

    if cfg.format in ("csv", "tsv", "parquet"):
        loader._check_column(files, cfg.format, cfg.column)
    tasks, unit = [], 0
    for path, size, _ in files:
        base = {"path": path, "size": size, "start": 0, "end": size, "group": -1, "names": "[]"}
        if cfg.format == "parquet":
            for g in range(_row_groups(path)):
                tasks.append({**base, "kind": GROUP, "group": g, "unit": unit, "units": 1})
                unit += 1
        elif cfg.format == "csv" or (cfg.format == "tsv" and _compressed(path)):
            units = size * (COMPRESSION if _compressed(path) else 1) // range_bytes + 1
            tasks.append({**base, "kind": STREAM, "unit": unit, "units": units})
            unit += units
        else:
            names = json.dumps(loader.header(path, cfg.format)) if cfg.format == "tsv" else "[]"
            for a in range(0, size, range_bytes):
                tasks.append({**base, "kind": RANGE, "start": a, "end": min(a + range_bytes, size), "names": names,
                              "unit": unit, "units": 1})
                unit += 1
    return tasks, unit


def _table_options(fmt: str, column: str, names: list[str] | None = None) -> dict:
    """The CSV / TSV reader's options, as ``loaders.corpus.corpus_dataset`` gives Ray Data's reader."""
    import pyarrow.csv as pacsv

    from augsbert_ray.loaders import corpus as loader

    return {"read_options": pacsv.ReadOptions(use_threads=False, column_names=names),
            "parse_options": loader._parse_options(fmt),
            "convert_options": pacsv.ConvertOptions(include_columns=[column], column_types={column: pa.string()})}


def _range_table(row: dict, column: str, max_chars: int, long_lines: str) -> pa.Table:
    """A TSV byte range's cleaned rows (the header's range reads the header itself)."""
    import pyarrow.csv as pacsv

    from augsbert_ray.loaders import corpus as loader

    path = str(row["path"])
    fs, p = loader._filesystem(path)
    with fs.open_input_file(p) as f:
        first, body = loader._range_lines(f, int(row["size"]), int(row["start"]), int(row["end"]))
    if not body:
        return loader.clean_column(pa.table({column: pa.array([], pa.string())}), column, max_chars, long_lines)
    names = json.loads(row["names"]) if first > 0 else None
    try:
        table = pacsv.read_csv(pa.BufferReader(body), **_table_options("tsv", column, names))
    except pa.ArrowInvalid as e:
        line = 1 if first == 0 else loader._line_number(path, first)
        raise loader.bad_row(path, "tsv", column, str(e), body, line) from None
    return loader.clean_column(table, column, max_chars, long_lines)


def _group_table(row: dict, column: str, max_chars: int, long_lines: str) -> pa.Table:
    """A Parquet row group's cleaned values."""
    from augsbert_ray.errors import DataError
    from augsbert_ray.loaders import corpus as loader

    path = str(row["path"])
    fs, p = loader._filesystem(path)
    try:
        with fs.open_input_file(p) as f:
            table = pq.ParquetFile(f).read_row_group(int(row["group"]), columns=[column], use_threads=False)
        return loader.clean_column(table, column, max_chars, long_lines)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise DataError(path, None, column, f"row group {row['group']} unreadable as text: {e}") from None


def _streamed_units(row: dict, fmt: str, column: str, max_chars: int, long_lines: str, range_bytes: int):
    """A CSV (or compressed) file streamed in row batches by the reader Ray Data uses: (unit,
    cleaned rows) for each of its units in order. A unit is closed once it holds ``range_bytes``
    of the column's text, which is no more than the file's bytes: the ``size // range_bytes + 1``
    units that ``read_tasks`` gives the file hold every row (a compressed file's rows beyond
    ``COMPRESSION`` times its size go to its last unit)."""
    import pyarrow.csv as pacsv

    from augsbert_ray.loaders import corpus as loader

    path = str(row["path"])
    fs, p = loader._filesystem(path)

    def cleaned(batches: list) -> pa.Table:
        return loader.clean_column(pa.Table.from_batches(batches), column, max_chars, long_lines)

    held, unit, text = [], int(row["unit"]), 0
    last = unit + int(row["units"]) - 1  # the next file's units are not this one's
    try:
        with fs.open_input_stream(p) as f:  # decompressed by its name's extension, as Ray Data's reader does
            for batch in pacsv.open_csv(f, **_table_options(fmt, column)):
                held.append(batch)
                text += pc.sum(pc.binary_length(batch.column(0))).as_py() or 0
                if text >= range_bytes and unit < last:
                    yield unit, cleaned(held)
                    held, unit, text = [], unit + 1, 0
    except pa.ArrowInvalid as e:
        raise loader.bad_row(path, fmt, column, str(e)) from None
    if held:
        yield unit, cleaned(held)


def _unit_lines(row: dict, fmt: str, column: str | None, max_chars: int, long_lines: str, on_bad_lines: str,
                range_bytes: int):
    """(read unit, cleaned lines: ``text``, ``status``) of one read task, in corpus order."""
    from augsbert_ray.loaders import corpus as loader

    if row["kind"] == STREAM:
        yield from _streamed_units(row, fmt, column, max_chars, long_lines, range_bytes)
    elif row["kind"] == GROUP:
        yield row["unit"], _group_table(row, column, max_chars, long_lines)
    elif fmt == "tsv":
        yield row["unit"], _range_table(row, column, max_chars, long_lines)
    else:
        yield row["unit"], loader.read_ranges({k: [row[k]] for k in ("path", "size", "start", "end")}, fmt, column,
                                              max_chars, long_lines, on_bad_lines)


def _spill_lines(lines: pa.Table, unit: int, work: str, shards: int) -> list[int]:
    """A read unit's kept texts, each once at its first position, written into their hash
    shards; the shards written."""
    texts = lines.column(schema.TEXT).combine_chunks()
    kept = pc.is_valid(texts)
    pos = (np.int64(unit) << 32) + np.flatnonzero(kept.to_numpy(zero_copy_only=False)).astype(np.int64)
    distinct = _first_positions(texts.filter(kept), pos)
    written = []
    if distinct.num_rows:
        shard = _stable_hash(distinct.column(schema.TEXT).combine_chunks()) % np.uint64(shards)
        for s in np.unique(shard).tolist():
            write_atomic(Path(work) / "lines" / f"{s:05d}" / f"{unit:06d}.parquet",
                         distinct.filter(pa.array(shard == s)))
            written.append(s)
    return written


def _read_range(batch: pa.Table, work: str, shards: int, fmt: str, column: str | None, max_chars: int,
                long_lines: str, on_bad_lines: str, range_bytes: int) -> pa.Table:
    """Round 1, one read task (``read_tasks``): its counts (or its first bad line's error, as JSON)."""
    from augsbert_ray.errors import DataError
    from augsbert_ray.loaders import corpus as loader

    row = batch.to_pylist()[0]
    i = row["index"]
    counts, written = {"lines": 0}, []
    try:
        for unit, lines in _unit_lines(row, fmt, column, max_chars, long_lines, on_bad_lines, range_bytes):
            status = lines.column(loader.STATUS)
            errors = lines.filter(pc.equal(status, loader.ERROR))
            if errors.num_rows:
                return _range_row(i, None, errors.column(schema.TEXT)[0].as_py(), [])
            for item in pc.value_counts(status).to_pylist():
                counts[item["values"]] = counts.get(item["values"], 0) + item["counts"]
            counts["lines"] += lines.num_rows
            written += _spill_lines(lines, unit, work, shards)
    except DataError as e:  # travels as a row (an exception would reach the driver wrapped by Ray Data)
        return _range_row(i, None, json.dumps({"path": e.path, "line": e.line, "field": e.field,
                                               "reason": e.reason}), [])
    return _range_row(i, json.dumps(counts), None, written)


def _range_row(i: int, counts: str | None, error: str | None, written: list[int]) -> pa.Table:
    return pa.table({"index": pa.array([i], pa.int64()), "counts": pa.array([counts], pa.string()),
                     "error": pa.array([error], pa.string()), WRITTEN: pa.array([json.dumps(written)], pa.string()),
                     NODE: pa.array([node_id()], pa.string())})


def expected_files(rows: list[dict], size: int) -> list[int]:
    """How many files each of ``size`` folders should hold, from the rows of the tasks that wrote them."""
    expected = [0] * size
    for r in rows:
        for f in json.loads(r[WRITTEN]):
            expected[f] += 1
    return expected


def check_found(rows: list[dict], expected: list[int], folder: Path) -> None:
    """Every file a round wrote was found by the task of the next round that reads it.

    Raises:
        AugSBERTError: some were not: written on a node whose disk the reader does not see.
    """
    from augsbert_ray.errors import AugSBERTError

    missing = sum(max(0, expected[r["index"]] - r[FOUND]) for r in rows if expected[r["index"]])
    if missing:
        raise AugSBERTError(f"{folder}: {missing} of {sum(expected)} files written by Ray tasks were not found by the "
                            "tasks that read them: on a cluster of several nodes, the run directory must be on "
                            "storage that every node reads and writes (a shared file system)")


def _dedup_shard(batch: pa.Table, work: str) -> pa.Table:
    """Round 2, one hash shard: each text once at its first position, written by the read unit
    of that position; how many it holds from each unit."""
    s = batch.column("index")[0].as_py()
    folder = Path(work) / "lines" / f"{s:05d}"
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    table = pa.concat_tables([pq.read_table(f) for f in files]) if files else pa.table(
        {schema.TEXT: pa.array([], pa.string()), POS: pa.array([], pa.int64())})
    distinct = _first_positions(table.column(schema.TEXT).combine_chunks(), table.column(POS).to_numpy())
    del table
    where = distinct.column(POS).to_numpy() >> 32
    ranges, sizes = np.unique(where, return_counts=True)
    for i in ranges.tolist():
        write_atomic(Path(work) / "ranges" / f"{i:06d}" / f"{s:05d}.parquet", distinct.filter(pa.array(where == i)))
    shutil.rmtree(folder, ignore_errors=True)
    return pa.table({"index": [s], FOUND: [len(files)], WRITTEN: [json.dumps(ranges.tolist())],
                     "sizes": [json.dumps(sizes.tolist())], NODE: [node_id()]})


def _number_range(batch: pa.Table, work: str, out: str, ranges: list[int], first_ids: list[int],
                  new_ids: list[int], expected: list[int], keep_ref, row_group: int) -> pa.Table:
    """Round 3, one read unit's first appearances: their ids (``first_ids[p]`` on, in position
    order), the seeded sample kept (renumbered from ``new_ids[p]``), as sentence part ``p``."""
    import ray

    p = batch.column("index")[0].as_py()
    i = ranges[p]
    folder = Path(work) / "ranges" / f"{i:06d}"
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    if len(files) != expected[i]:
        return pa.table({"index": [i], FOUND: [len(files)], NODE: [node_id()]})  # the driver says what is missing
    table = pa.concat_tables([pq.read_table(f) for f in files]).sort_by(POS)
    ids = first_ids[p] + np.arange(table.num_rows, dtype=np.int64)
    texts = table.column(schema.TEXT)
    if keep_ref is not None:  # a seeded sample of the ids, renumbered in order
        keep = ray.get(keep_ref)
        at = np.minimum(np.searchsorted(keep, ids), len(keep) - 1)
        kept = keep[at] == ids
        ids, texts = at[kept], texts.filter(pa.array(kept))
    if len(ids) and ids[0] != new_ids[p]:
        raise RuntimeError(f"sentence part {p}: ids start at {ids[0]}, not {new_ids[p]}")
    write_atomic(part_path(Path(out), p), pa.table({schema.SENTENCE_ID: pa.array(ids, pa.int64()), schema.TEXT: texts},
                                                   schema=schema.SENTENCE_SCHEMA), row_group)
    return pa.table({"index": [i], FOUND: [len(files)], NODE: [node_id()]})


def each(indices: list[int], fn, **kwargs) -> list[dict]:
    """``fn`` over one-row blocks ``{"index": i}`` as Ray Data tasks (one CPU each); their rows."""
    import ray

    if not indices:
        return []
    ds = ray.data.from_items([{"index": i} for i in indices], override_num_blocks=len(indices))
    return ds.map_batches(fn, batch_size=1, batch_format="pyarrow", fn_kwargs=kwargs, num_cpus=1).take_all()


def shard_corpus(cfg, files: list[tuple], out: Path, seed: int = 0) -> SentenceParts:
    """Reads, cleans and deduplicates the corpus (``config.CorpusConfig``, any format) in Ray
    Data tasks, into id-ordered sentence parts under ``out / "sentences.parts"``.

    Args:
        files: the corpus's ``loaders.corpus.list_files`` entries.
        out: the stage's folder (scratch files go to ``out / "_shards"``, removed at the end).
        seed: the job seed (the ``max_sentences`` sample, as ``read_corpus`` draws it).

    Raises:
        DataError: a CSV, TSV or Parquet file without the column; a bad line (``on_bad_lines:
            error``; a row the CSV reader refuses, whatever the setting): the first in corpus order.
    """
    from augsbert_ray.errors import DataError
    from augsbert_ray.loaders import corpus as loader

    out = Path(out)
    work, parts = out / "_shards", out / "sentences.parts"
    for folder in (work, parts):
        shutil.rmtree(folder, ignore_errors=True)
    total_bytes = sum(size for _, size, _ in files)
    shards = max(1, math.ceil(total_bytes / SHARD_BYTES))
    tasks, units = read_tasks(cfg, files, loader.RANGE_BYTES)
    log.info(f"[corpus] {len(files)} {cfg.format} files, {total_bytes / 2**20:.1f} MiB, from {cfg.path}: "
             f"{len(tasks)} read tasks, {shards} hash shards")
    rows = _each_range(tasks, work, shards, cfg, loader.RANGE_BYTES)
    bad = sorted((r for r in rows if r["error"] is not None), key=lambda r: r["index"])
    if bad:
        shutil.rmtree(work, ignore_errors=True)
        raise DataError(**json.loads(bad[0]["error"]))
    counts = {k: 0 for k in ("lines", loader.OK, loader.TRUNCATED, loader.EMPTY, loader.TOO_LONG, loader.BAD)}
    for r in rows:
        for k, v in json.loads(r["counts"]).items():
            counts[k] += v
    deduped = each(list(range(shards)), _dedup_shard, work=str(work))
    check_found(deduped, expected_files(rows, shards), work / "lines")
    # A sentence's id is its first appearance's rank: the sentences first seen in earlier read
    # units, then its rank within its own unit.
    per_unit = np.zeros(units, np.int64)
    for r in deduped:
        per_unit[json.loads(r[WRITTEN])] += json.loads(r["sizes"])
    first_ids = np.concatenate([[0], np.cumsum(per_unit)])
    distinct = int(first_ids[-1])
    kept = counts[loader.OK] + counts[loader.TRUNCATED]
    counts.update(duplicates=kept - distinct, distinct=distinct, sampled_out=0)
    keep_ref, new_ids = None, first_ids
    if cfg.max_sentences is not None and distinct > cfg.max_sentences:
        import ray

        # read_corpus's own draw, so the sample is the same sentences
        keep = np.sort(np.random.default_rng([seed, 7]).choice(distinct, cfg.max_sentences, replace=False))
        keep_ref, new_ids = ray.put(keep), np.searchsorted(keep, first_ids)
        del keep
        counts["sampled_out"] = distinct - int(new_ids[-1])
    n = int(new_ids[-1])
    counts["sentences"] = n
    nonempty = [i for i in range(units) if new_ids[i + 1] > new_ids[i]]  # one part each, in order
    expected = expected_files(deduped, units)
    numbered = each(list(range(len(nonempty))), _number_range, work=str(work), out=str(parts), ranges=nonempty,
                    first_ids=[int(first_ids[i]) for i in nonempty], new_ids=[int(new_ids[i]) for i in nonempty],
                    expected=expected, keep_ref=keep_ref, row_group=QUERY_BLOCK)
    check_found(numbered, expected, work / "ranges")
    offsets = [int(new_ids[i]) for i in nonempty] + [n]
    shutil.rmtree(work, ignore_errors=True)
    nodes = {"read": nodes_of(rows), "dedup": nodes_of(deduped), "number": nodes_of(numbered)}
    log.info(f"[corpus] {counts['lines']:,} lines: {counts[loader.OK]:,} kept as they are, "
             f"{counts[loader.TRUNCATED]:,} truncated, {counts[loader.EMPTY]:,} empty, {counts[loader.TOO_LONG]:,} too "
             f"long and {counts[loader.BAD]:,} bad left out, {counts['duplicates']:,} repeats; {n:,} sentences"
             + (f" (a seeded sample of {distinct:,})" if counts["sampled_out"] else "")
             + f" in {len(nonempty)} parts; " + ", ".join(f"{k} {on_nodes(v)}" for k, v in nodes.items()),
             extra={"task_nodes": nodes})
    return SentenceParts(parts, n, offsets, counts, nodes)


def _each_range(tasks: list[dict], work: Path, shards: int, cfg, range_bytes: int) -> list[dict]:
    import ray

    if not tasks:
        return []
    ds = ray.data.from_items([{"index": i, **t} for i, t in enumerate(tasks)], override_num_blocks=len(tasks))
    return ds.map_batches(_read_range, batch_size=1, batch_format="pyarrow", num_cpus=1, fn_kwargs={
        "work": str(work), "shards": shards, "fmt": cfg.format, "column": cfg.column, "max_chars": cfg.max_chars,
        "long_lines": cfg.long_lines, "on_bad_lines": cfg.on_bad_lines, "range_bytes": range_bytes}).take_all()
