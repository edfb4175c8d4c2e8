"""Candidate rows cut into shards, and the store that commits each labelled shard once."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.models import file_sha256

SHARD = "_shard"  # the shard a candidate row belongs to (dropped from the silver table)
KEY_COLUMNS = [schema.ID1, schema.ID2]
# What a shard's input digest covers, with one type each: the digest is then the same whether the
# driver cut the shard or a worker read it (a read may add metadata or give other nullability).
INPUT_SCHEMA = pa.schema([schema.CANDIDATE_SCHEMA.field(c) for c in
                          (schema.ID1, schema.ID2, schema.SENTENCE1, schema.SENTENCE2)])
TOKEN_FILE = ".writers"  # the token that tells a worker it sees the driver's store (``ShardStore.open_for_workers``)


class ShardStore:
    """Labelled shards under deterministic names, each committed once with its manifest.

    Shard ``i`` holds candidate rows ``[i * size, (i + 1) * size)``. Its labelled rows go to
    ``part-{i:06d}.parquet`` (written under a temporary name, then renamed) and then its
    manifest ``part-{i:06d}.json`` (the shard's input digest, row count, the file's sha256 and
    the node that wrote it), also renamed into place. A shard counts as done only when its
    manifest matches the input and the file it names: a crash at any point leaves a shard either
    done or redone, never half there. A commit runs in the driver or in the labelling actor that
    labelled the shard (``labeling.commit``), where the store's folder is shared with the workers.

    ``root`` is a folder (a path or a ``file://`` URI) or a storage URI (``s3://``, ``gs://``, any
    location ``pyarrow.fs`` opens): ``ShardStore(uri)`` is then a ``uri_store.UriShardStore``,
    the same names and checks without a rename (one PUT of an object is atomic), which every
    worker that can open the storage commits to.
    """

    def __new__(cls, root: str | os.PathLike | None = None):
        if cls is ShardStore and root is not None and on_storage(root):
            from augsbert_ray.labeling.uri_store import UriShardStore

            return super().__new__(UriShardStore)
        return super().__new__(cls)

    def __init__(self, root: str | os.PathLike):
        self.root = Path(local_path(root))
        self.root.mkdir(parents=True, exist_ok=True)
        self.location = str(self.root.resolve())  # what a worker opens it by

    @property
    def where(self) -> str:
        """The store's location, for messages."""
        return str(self.root)

    def part(self, i: int) -> Path:
        return self.root / f"part-{i:06d}.parquet"

    def manifest(self, i: int) -> Path:
        return self.root / f"part-{i:06d}.json"

    def has_manifest(self, i: int) -> bool:
        return self.manifest(i).exists()

    def record(self, i: int) -> dict | None:
        """Shard ``i``'s manifest as written; None when it has none (or an unreadable one)."""
        try:
            return json.loads(self.manifest(i).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def verified(self, i: int, digest: str) -> dict | None:
        """Shard ``i``'s manifest where it matches the input ``digest`` and the file it names; else None."""
        record = self.record(i)
        try:
            part = self.part(i)
            if (record is not None and record["input"] == digest and part.stat().st_size == record["bytes"]
                    and file_sha256(part) == record["sha256"]):
                return record
        except (OSError, KeyError, TypeError):
            pass
        return None

    def done(self, i: int, digest: str) -> bool:
        return self.verified(i, digest) is not None

    def committed(self) -> set[int]:
        """The shards with a manifest (a listing, nothing read): those a resume has to verify."""
        folder = self.manifest(0).parent
        return {int(p.stem.split("-")[1]) for p in folder.glob("part-*.json") if p.stem.split("-")[1].isdigit()}

    def commit(self, i: int, table: pa.Table, digest: str, writer: str | None = None) -> dict:
        """Writes shard ``i``'s labelled rows, then its manifest; returns the manifest.

        Idempotent: a shard written twice (a labelling task retried after its commit) ends as one
        file with one manifest naming that file's sha256. Each write has a temporary name of its
        own, and after the manifest is in place the file is hashed again: where another writer
        replaced the file meanwhile, the manifest is rewritten for the file that is there.

        Args:
            writer: what wrote it (a Ray node id), recorded in the manifest.
        """
        import pyarrow.parquet as pq

        from augsbert_ray.rundir import written_whole

        part = self.part(i)
        tmp = part.with_name(f".{part.name}.{uuid.uuid4().hex[:12]}.tmp")
        with written_whole(tmp, part):  # a full disk: one error naming the part, no partial file kept
            pq.write_table(table, tmp)
        sha = file_sha256(tmp)
        os.replace(tmp, part)
        for _ in range(3):
            placed = _identity(part)
            record = {"input": digest, "rows": table.num_rows, "bytes": placed[1], "sha256": sha, "writer": writer}
            manifest = self.manifest(i)
            tmp = manifest.with_name(f".{manifest.name}.{uuid.uuid4().hex[:12]}.tmp")
            with written_whole(tmp, manifest):
                tmp.write_text(json.dumps(record), encoding="utf-8")
            os.replace(tmp, manifest)
            if _identity(part) == placed:  # the file the manifest names is still the one in place
                return record
            sha = file_sha256(part)  # another writer's file of the same rows replaced it: name that one
        return record

    def open_for_workers(self) -> str:
        """Writes a new token into the store's folder and returns it: a labelling actor that reads
        the same token there sees this folder (a shared file system, or the driver's node) and
        commits its shards itself; one that does not sends them to the driver."""
        token = uuid.uuid4().hex
        path = self.root / TOKEN_FILE
        tmp = path.with_name(f"{path.name}.{token}.tmp")
        tmp.write_text(token, encoding="utf-8")
        os.replace(tmp, path)
        return token

    def read(self, i: int) -> pa.Table:
        import pyarrow.parquet as pq

        return pq.read_table(self.part(i), use_threads=False)  # a shard is small: threads only hold memory


def _identity(path: Path) -> tuple[int, int, int]:
    """What tells one file from another put in its place: inode, size, modification time."""
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def sees_store(root: str | os.PathLike, token: str) -> bool:
    """Whether this process sees the store ``root`` (a folder or a storage URI) that
    ``ShardStore.open_for_workers`` wrote ``token`` into (nothing is created where it does not):
    a worker that can open a URI's storage sees it."""
    if on_storage(root):
        from augsbert_ray.labeling.uri_store import sees

        return sees(str(root), token)
    try:
        return (Path(local_path(root)) / TOKEN_FILE).read_text(encoding="utf-8") == token
    except OSError:
        return False


def on_storage(location: str | os.PathLike) -> bool:
    """Whether a store's location is a storage URI (``s3://``, ``gs://``, ...) rather than a folder
    (a path, or a ``file://`` URI: a folder, where a rename is atomic)."""
    from augsbert_ray.rundir import is_uri

    return is_uri(location)


def local_path(location: str | os.PathLike) -> str:
    """A folder's path, given as a path or a ``file://`` URI."""
    text = str(location)
    if text.startswith("file://"):
        import pyarrow.fs as pafs

        return pafs.FileSystem.from_uri(text)[1]
    return text


def remove_stores(location: str | os.PathLike, keep: str | None = None) -> None:
    """Removes the folder of stores at ``location`` (a path or a storage URI), or with ``keep``
    every store in it but the one named ``keep``."""
    import shutil

    if on_storage(location):
        from augsbert_ray.labeling.uri_store import remove

        remove(str(location), keep)
        return
    folder = Path(local_path(location))
    if keep is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for old in folder.glob("*") if folder.exists() else []:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


def keys_digest(table: pa.Table) -> str:
    """What identifies a shard's input: its pairs' ids and sentences, in order (``INPUT_SCHEMA``)."""
    from augsbert_ray.rundir import table_fingerprint

    cols = [table.column(f.name).cast(f.type) for f in INPUT_SCHEMA]
    return table_fingerprint(pa.Table.from_arrays(cols, schema=INPUT_SCHEMA).combine_chunks())


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
