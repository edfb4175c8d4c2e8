"""How a training's pairs reach its workers: whole through the object store, or streamed.

A small training set (a table, or files or a Ray Data dataset given as a ``TrainingSet``) travels
as one Arrow table put in Ray's object store, which every worker reads whole and tokenises once
(``loop.PairTrainer``'s pre-tokenised batches: the fastest steps). A large one is *staged*: written once, in fixed blocks of ``ROWS_PER_BLOCK`` rows, to an uncompressed Arrow IPC
file beside the run's checkpoints (Ray Train's storage: a local folder, a shared file system or
``s3://``), and each worker reads from it only the rows of its own batches (``PairReader``),
block by block, with ranged reads. Nothing a worker holds grows with the pairs' text.

Why a staged file and per-rank index batches rather than Ray Data's ``get_dataset_shard``: a
worker's batches must be exactly today's (``loop.shard_order``: a seeded permutation of every
row, padded by wrapping and strided by rank; ``loop.length_grouped_batches``: chunks sorted by
token length, the batches shuffled), so that a streamed training trains the same weights as an
in-memory one and a restarted worker resumes at a step with the batches it would have had.
``streaming_split`` hands each rank whole blocks in the order the executor produces them and
``random_shuffle`` draws its own order, so neither reproduces that order, nor lets a resumed
rank start at step ``s`` without reading the epoch up to it. With the file, every rank computes
the epoch's global order from the row count and the pairs' token lengths and reads its rows by
index, in any order, from any step.

What remains per row in a worker is an index: the epoch's permutation while it is drawn (4
bytes a row, freed at once), this rank's order (4 bytes a row / world) and, with length
grouping, the token lengths (2 bytes a row, computed once by a pass over the file and cached
beside it). ``benchmarks/training_ingest.py`` measures a worker at 1M and 10M pairs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from augsbert_ray import schema

ROWS_PER_BLOCK = 1024  # rows per record batch of a staged file: a batch's row costs one block read
# Tables above this many rows are streamed rather than held whole by every worker: at this size
# the pre-tokenised rows already take a few hundred MB per worker.
STREAM_ABOVE_ROWS = 262_144
STAGED_FILE = "pairs.arrow"
_LENGTHS_PREFIX = "lengths-"


@dataclass(frozen=True)
class TrainingSet:
    """Training pairs that are not held in memory: Parquet files or a Ray Data dataset.

    Use ``from_files`` (a student's gold and silver pairs, as ``stages.student`` puts them
    together from tables) or ``from_dataset``. ``rows`` is their count, known without reading
    them (Parquet footers; a dataset's ``count()``).
    """

    parts: tuple[tuple[Any, bool | None, int], ...]  # (files or a dataset, is_silver flag, repeats)
    silver_as_classes: bool = False
    rows: int = 0
    has_silver_flags: bool = field(default=False)

    @classmethod
    def from_files(cls, gold: str | os.PathLike | list | None = None, silver: str | os.PathLike | list | None = None,
                   *, gold_repeat: int = 1, silver_as_classes: bool = False) -> TrainingSet:
        """Gold pairs (each ``gold_repeat`` times) then silver pairs, from Parquet files with
        ``sentence1``, ``sentence2`` and ``label`` columns, flagged as ``schema.IS_SILVER`` says;
        ``silver_as_classes``: the teacher's scores become classes at 0.5 (a binary task), as
        ``stages.student.student_training_set`` makes them.

        Raises:
            ValueError: neither gold nor silver, or a file without the pair columns.
        """
        import pyarrow.parquet as pq

        if gold is None and silver is None:
            raise ValueError("a training set needs gold or silver pairs")
        parts, rows = [], 0
        for paths, flag, repeat in ((gold, False, gold_repeat), (silver, True, 1)):
            if paths is None:
                continue
            paths = tuple(str(p) for p in (paths if isinstance(paths, (list, tuple)) else [paths]))
            for p in paths:
                meta = pq.read_schema(p)
                missing = [c for c in schema.PAIR_COLUMNS if c not in meta.names]
                if missing:
                    raise ValueError(f"{p}: no column {', '.join(missing)} (training pairs need "
                                     f"{', '.join(schema.PAIR_COLUMNS)})")
                rows += pq.ParquetFile(p).metadata.num_rows * repeat
            parts.append((paths, flag, repeat))
        return cls(tuple(parts), silver_as_classes, rows, has_silver_flags=True)

    @classmethod
    def from_dataset(cls, dataset) -> TrainingSet:
        """A Ray Data dataset of training pairs (its ``schema.IS_SILVER`` column kept where it has one)."""
        names = dataset.schema().names
        missing = [c for c in schema.PAIR_COLUMNS if c not in names]
        if missing:
            raise ValueError(f"the training dataset has no column {', '.join(missing)}")
        return cls(((dataset, None, 1),), False, dataset.count(), has_silver_flags=schema.IS_SILVER in names)

    @property
    def num_rows(self) -> int:
        return self.rows

    def batches(self, rows: int = 65_536) -> Iterator[pa.Table]:
        """The pairs in order, a few ``rows`` at a time, with the training columns."""
        import pyarrow.parquet as pq

        for source, flag, repeat in self.parts:
            for _ in range(repeat):
                if flag is None:  # a dataset
                    for b in source.iter_batches(batch_size=rows, batch_format="pyarrow"):
                        yield _training_columns(b, None, False)
                    continue
                for path in source:
                    for b in pq.ParquetFile(path).iter_batches(batch_size=rows, columns=schema.PAIR_COLUMNS):
                        yield _training_columns(pa.Table.from_batches([b]), flag,
                                                flag and self.silver_as_classes)

    def to_table(self) -> pa.Table:
        """Every pair in one table (what a seed search needs)."""
        return pa.concat_tables(list(self.batches()))

    def label_mean(self) -> float | None:
        """The mean label over every pair (repeats counted, classes as trained on), read a
        column at a time; None without pairs."""
        import pyarrow.parquet as pq

        total, rows = 0.0, 0
        for source, flag, repeat in self.parts:
            if flag is None:  # a dataset
                labels = (b.column(schema.LABEL).to_numpy() for b in
                          source.select_columns([schema.LABEL]).iter_batches(batch_size=65_536,
                                                                             batch_format="pyarrow"))
            else:
                labels = (b.column(0).to_numpy() for path in source
                          for b in pq.ParquetFile(path).iter_batches(batch_size=65_536, columns=[schema.LABEL]))
            for values in labels:
                if flag and self.silver_as_classes:
                    values = values >= 0.5
                total += float(np.sum(values, dtype=np.float64)) * repeat
                rows += len(values) * repeat
        return total / rows if rows else None


def _training_columns(table: pa.Table, flag: bool | None, as_classes: bool) -> pa.Table:
    table = table.select(schema.training_columns(table) if flag is None else schema.PAIR_COLUMNS)
    if as_classes:
        classes = pa.array(table.column(schema.LABEL).to_numpy() >= 0.5, pa.float32())
        table = table.set_column(2, table.schema.field(schema.LABEL).with_type(pa.float32()), classes)
    if flag is not None:
        table = table.append_column(schema.IS_SILVER, pa.array(np.full(table.num_rows, flag), pa.bool_()))
    return table


@dataclass(frozen=True)
class StagedPairs:
    """A staged training set: ``location`` (a path or URI) holds ``rows`` pairs in blocks of
    ``block`` rows, whose content ``digest`` names; ``folder`` also holds the token lengths
    cached by the workers."""

    location: str
    folder: str
    rows: int
    block: int
    digest: str


def _filesystem(location: str):
    import pyarrow.fs as pafs

    from augsbert_ray.rundir import is_uri

    return pafs.FileSystem.from_uri(location) if is_uri(location) else (pafs.LocalFileSystem(), location)


# Staged columns: texts as large strings (a block never hits 2 GiB offsets) and labels as float64,
# which holds any label exactly until the loop makes it float32, as it makes an in-memory one.
def _staged_schema(silver: bool) -> pa.Schema:
    fields = [pa.field(schema.SENTENCE1, pa.large_string()), pa.field(schema.SENTENCE2, pa.large_string()),
              pa.field(schema.LABEL, pa.float64())]
    return pa.schema(fields + ([pa.field(schema.IS_SILVER, pa.bool_())] if silver else []))


def stage(pairs: pa.Table | TrainingSet, folder: str) -> StagedPairs:
    """Writes ``pairs`` to ``folder/pairs.arrow`` in blocks (see the module), whole or not at all.

    The file is written under a temporary name and moved into place. Token lengths cached for
    other content are removed; those of the same content (a re-run staging the same pairs) are
    kept. The driver reads the pairs a few thousand at a time: its memory does not grow with them.

    Raises:
        ValueError: no pairs.
    """
    from augsbert_ray.labeling.shards import exact_shards

    fs, base = _filesystem(folder)
    fs.create_dir(base, recursive=True)
    silver = (schema.IS_SILVER in pairs.column_names) if isinstance(pairs, pa.Table) else pairs.has_silver_flags
    out_schema = _staged_schema(silver)
    chunks = (pairs.slice(i, 65_536) for i in range(0, pairs.num_rows, 65_536)) if isinstance(pairs, pa.Table) \
        else pairs.batches()
    path, tmp = f"{base}/{STAGED_FILE}", f"{base}/.{STAGED_FILE}.writing"
    rows, digest = 0, hashlib.sha256()
    with fs.open_output_stream(tmp) as sink, pa.ipc.new_file(sink, out_schema) as writer:
        for block in exact_shards((c.select(out_schema.names).cast(out_schema) for c in chunks), ROWS_PER_BLOCK):
            batch = block.combine_chunks().to_batches()[0]  # one record batch per block
            writer.write_batch(batch)
            digest.update(batch.serialize())
            rows += block.num_rows
    if rows == 0:
        fs.delete_file(tmp)
        raise ValueError("no training pairs")
    fs.move(tmp, path)
    digest = digest.hexdigest()
    for info in fs.get_file_info(_selector(base)):
        if info.base_name.startswith(_LENGTHS_PREFIX) and not info.base_name.startswith(_lengths_prefix(digest)):
            fs.delete_file(info.path)
    where = f"{folder.rstrip('/')}/{STAGED_FILE}" if _is_uri(folder) else os.path.abspath(path)
    return StagedPairs(where, folder if _is_uri(folder) else os.path.abspath(folder), rows, ROWS_PER_BLOCK, digest)


def _lengths_prefix(digest: str) -> str:
    return f"{_LENGTHS_PREFIX}{digest[:16]}-"


def lengths_path(staged: StagedPairs, key: dict) -> str:
    """Where the token lengths of ``staged``'s pairs under the tokenisation ``key`` are cached."""
    tokenisation = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{_filesystem(staged.folder)[1]}/{_lengths_prefix(staged.digest)}{tokenisation}.npy"


def write_lengths(staged: StagedPairs, key: dict, lengths: np.ndarray, rank: int = 0) -> None:
    """Caches ``lengths`` (one per pair, ``uint16``) for ``staged`` under ``key``, whole or not at all."""
    fs, _ = _filesystem(staged.folder)
    path = lengths_path(staged, key)
    tmp = f"{path}.{rank}.writing"  # several ranks may compute them at once: each moves its own
    with fs.open_output_stream(tmp) as f:
        f.write(np.ascontiguousarray(lengths, dtype=np.uint16).tobytes())
    fs.move(tmp, path)


def _is_uri(location: str) -> bool:
    from augsbert_ray.rundir import is_uri

    return is_uri(location)


def _selector(base: str):
    import pyarrow.fs as pafs

    return pafs.FileSelector(base, allow_not_found=True)


def feed(pairs: pa.Table | TrainingSet, folder: str, stream_above_rows: int) -> dict:
    """The training data's entry of the training function's config: ``{"table": ref}`` (pairs
    of at most ``stream_above_rows`` rows, a table in the object store; a ``TrainingSet`` that
    small is read whole) or ``{"staged": StagedPairs}``."""
    if pairs.num_rows <= stream_above_rows:
        import ray

        table = pairs if isinstance(pairs, pa.Table) else pairs.to_table()
        return {"table": ray.put(table.select(schema.training_columns(table)))}
    return {"staged": stage(pairs, folder)}


class PairReader:
    """A worker's view of a staged training set: the rows of a batch, read block by block.

    Holds the file's footer (a few bytes per block of ``ROWS_PER_BLOCK`` rows) and, once read,
    the token lengths; a batch's rows are read from the blocks that hold them and dropped.
    """

    def __init__(self, staged: StagedPairs):
        self.staged = staged
        fs, path = _filesystem(staged.location)
        self._file = fs.open_input_file(path)
        self._reader = pa.ipc.open_file(self._file)
        self.has_silver = schema.IS_SILVER in self._reader.schema.names
        expected = math.ceil(staged.rows / staged.block)
        if self._reader.num_record_batches != expected:
            raise ValueError(f"{staged.location}: {self._reader.num_record_batches} blocks, not the {expected} of "
                             f"{staged.rows} rows staged; it was written again meanwhile")

    def __len__(self) -> int:
        return self.staged.rows

    def fetch(self, idx: np.ndarray) -> tuple[list[str], list[str], np.ndarray, np.ndarray | None]:
        """The pairs ``idx`` (row numbers, in order): first sentences, second sentences, labels
        (float32) and silver flags (None for a set that has none)."""
        idx = np.asarray(idx, dtype=np.int64)
        blocks, offsets = np.divmod(idx, self.staged.block)
        order = np.argsort(blocks, kind="stable")  # the rows grouped by block, each block's in idx order
        pieces = []
        for b in np.unique(blocks):
            pieces.append(self._reader.get_batch(int(b)).take(pa.array(offsets[blocks == b])))
        table = pa.Table.from_batches(pieces).take(pa.array(np.argsort(order)))
        s1 = table.column(schema.SENTENCE1).to_pylist()
        s2 = table.column(schema.SENTENCE2).to_pylist()
        labels = table.column(schema.LABEL).to_numpy().astype(np.float32)
        silver = table.column(schema.IS_SILVER).to_numpy(zero_copy_only=False).astype(bool) if self.has_silver \
            else None
        return s1, s2, labels, silver

    def blocks(self) -> Iterator[pa.RecordBatch]:
        for b in range(self._reader.num_record_batches):
            yield self._reader.get_batch(b)

    def lengths(self, recipe, key: dict, rank: int = 0) -> np.ndarray:
        """Each pair's token length as the in-memory loop computes it (``recipe``'s own
        tokenisation, ``loop.pair_lengths``), from the cache beside the file, or computed by one
        pass over it and cached there (whole, under a name of ``key``: the tokenisation's
        settings). The recipe's model must be built (its tokenizer)."""
        from augsbert_ray.training.loop import pair_lengths

        fs, _ = _filesystem(self.staged.folder)
        path = lengths_path(self.staged, key)
        try:
            with fs.open_input_file(path) as f:
                cached = np.frombuffer(f.read(), dtype=np.uint16)
            if len(cached) == len(self):
                return cached
        except (FileNotFoundError, OSError):
            pass
        out = np.empty(len(self), dtype=np.uint16)
        at = 0
        for block in self.blocks():
            s1 = block.column(schema.SENTENCE1).to_pylist()
            s2 = block.column(schema.SENTENCE2).to_pylist()
            n = len(s1)
            got = pair_lengths(recipe, recipe.pretokenize(s1, s2), n)
            if got.max() > np.iinfo(np.uint16).max:
                raise ValueError(f"a pair of {int(got.max())} tokens: token lengths are kept as uint16")
            out[at:at + n] = got
            at += n
        write_lengths(self.staged, key, out, rank)
        return out
