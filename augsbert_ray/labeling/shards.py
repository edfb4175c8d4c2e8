"""Candidate rows cut into shards and their digests (the store that commits each labelled shard
once is ``store``'s ``ShardStore``, also found here)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.labeling.store import TOKEN_FILE, ShardStore, sees_store  # noqa: F401 (where callers find them)

SHARD = "_shard"  # the shard a candidate row belongs to (dropped from the silver table)
KEY_COLUMNS = [schema.ID1, schema.ID2]
# What a shard's input digest covers, with one type each: the digest is then the same whether the
# driver cut the shard or a worker read it (a read may add metadata or give other nullability).
INPUT_SCHEMA = pa.schema([schema.CANDIDATE_SCHEMA.field(c) for c in
                          (schema.ID1, schema.ID2, schema.SENTENCE1, schema.SENTENCE2)])


def keys_digest(table: pa.Table) -> str:
    """What identifies a shard's input: its pairs' ids and sentences, in order (``INPUT_SCHEMA``)."""
    from augsbert_ray.rundir import table_fingerprint

    import numpy as np

    cols = [table.column(f.name).cast(f.type) for f in INPUT_SCHEMA]
    # A compact copy: the IPC stream of a slice differs from that of the same rows read back.
    keys = pa.Table.from_arrays(cols, schema=INPUT_SCHEMA).combine_chunks()
    return table_fingerprint(keys.take(pa.array(np.arange(keys.num_rows))))


def pairs_digest(table: pa.Table) -> str:
    """What a labelled shard is checked against: its pairs' ids in (id1, id2) order, hashed, so
    that the driver keeps a few bytes per pending shard whatever its size."""
    import hashlib

    import pyarrow.compute as pc

    order = pc.sort_indices(table, [(c, "ascending") for c in KEY_COLUMNS])
    h = hashlib.sha256()
    for c in KEY_COLUMNS:
        h.update(table.column(c).take(order).to_numpy().astype("<i8", copy=False).tobytes())
    return h.hexdigest()


def table_shards(table: pa.Table, size: int):
    """Slices of ``size`` rows, dictionary text columns decoded (a shard travels alone)."""
    plain = schema.decoded(table.schema)
    for start in range(0, table.num_rows, size):
        yield table.slice(start, size).cast(plain)


def exact_shards(tables, size: int):
    """Tables cut and joined into shards of exactly ``size`` rows (the last one may be shorter):
    a shard's rows, and so its digest, do not depend on how the input was batched."""
    buf: list[pa.Table] = []
    held = 0
    for rows in tables:
        while rows.num_rows:
            take = min(size - held, rows.num_rows)
            buf.append(rows.slice(0, take))
            held += take
            rows = rows.slice(take)
            if held == size:
                yield pa.concat_tables(buf)
                buf, held = [], 0
    if held:
        yield pa.concat_tables(buf)


def file_row_groups(path) -> list[tuple[int, int]]:
    """``(first row, rows)`` of each row group of a Parquet file (its footer only)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    groups, first = [], 0
    for g in range(meta.num_row_groups):
        rows = meta.row_group(g).num_rows
        groups.append((first, rows))
        first += rows
    return groups


def read_rows(path, start: int, stop: int, groups: list[tuple[int, int]] | None = None,
              read_group=None) -> pa.Table:
    """Rows ``[start, stop)`` of a Parquet file, reading only the row groups that hold them
    (each through ``read_group(g)`` when given, e.g. a cache of decoded groups)."""
    import pyarrow.parquet as pq

    groups = file_row_groups(path) if groups is None else groups
    wanted = [g for g, (first, rows) in enumerate(groups) if first < stop and first + rows > start]
    if not wanted:
        return pq.read_schema(path).empty_table()
    if read_group is None:
        table = pq.ParquetFile(path).read_row_groups(wanted, use_threads=False)
    else:
        table = pa.concat_tables([read_group(g) for g in wanted])
    first = start - groups[wanted[0]][0]
    # take, not slice: a slice would keep the whole row groups alive while the shard is held
    return table.take(pa.array(np.arange(first, first + stop - start, dtype=np.int64)))


def file_shards(path, size: int):
    """A Parquet file's rows in shards of ``size`` rows, read a row group at a time.

    Row group by row group, not ``iter_batches``: the batch reader's memory grows with the
    file (its allocations are not handed back while it reads), a row group's is freed with it.
    """
    import pyarrow.parquet as pq

    reader = pq.ParquetFile(path)
    groups = (reader.read_row_group(g, use_threads=False) for g in range(reader.metadata.num_row_groups))
    return exact_shards(groups, size)
