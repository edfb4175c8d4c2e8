"""Candidate rows cut into shards, and the store that commits each labelled shard once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.models import file_sha256

SHARD = "_shard"  # the shard a candidate row belongs to (dropped from the silver table)
KEY_COLUMNS = [schema.ID1, schema.ID2]


class ShardStore:
    """Labelled shards under deterministic names, each committed once with its manifest.

    Shard ``i`` holds candidate rows ``[i * size, (i + 1) * size)``. Its labelled rows go to
    ``part-{i:06d}.parquet`` (written under a temporary name, then renamed) and then its
    manifest ``part-{i:06d}.json`` (the shard's input digest, row count and the file's sha256),
    also renamed into place. A shard counts as done only when its manifest matches the input
    and the file it names: a crash at any point leaves a shard either done or redone, never
    half there.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def part(self, i: int) -> Path:
        return self.root / f"part-{i:06d}.parquet"

    def manifest(self, i: int) -> Path:
        return self.root / f"part-{i:06d}.json"

    def done(self, i: int, digest: str) -> bool:
        try:
            record = json.loads(self.manifest(i).read_text(encoding="utf-8"))
            part = self.part(i)
            return (record["input"] == digest and part.stat().st_size == record["bytes"]
                    and file_sha256(part) == record["sha256"])
        except (OSError, ValueError, KeyError):
            return False

    def commit(self, i: int, table: pa.Table, digest: str) -> None:
        import pyarrow.parquet as pq

        from augsbert_ray.rundir import written_whole

        part = self.part(i)
        tmp = part.with_name(f".{part.name}.tmp")
        with written_whole(tmp, part):  # a full disk: one error naming the part, no partial file kept
            pq.write_table(table, tmp)
        os.replace(tmp, part)
        record = {"input": digest, "rows": table.num_rows, "bytes": part.stat().st_size, "sha256": file_sha256(part)}
        tmp = self.manifest(i).with_name(f".{self.manifest(i).name}.tmp")
        with written_whole(tmp, self.manifest(i)):
            tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, self.manifest(i))

    def read(self, i: int) -> pa.Table:
        import pyarrow.parquet as pq

        return pq.read_table(self.part(i), use_threads=False)  # a shard is small: threads only hold memory


def keys_digest(table: pa.Table) -> str:
    """What identifies a shard's input: its pairs' ids and sentences, in order."""
    from augsbert_ray.rundir import table_fingerprint

    return table_fingerprint(table.select([*KEY_COLUMNS, schema.SENTENCE1, schema.SENTENCE2]).combine_chunks())


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
