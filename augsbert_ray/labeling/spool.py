"""Pending shards kept on the driver's disk, not in Ray's object store, until the pool takes them.

Shards that no Parquet file holds (``augsbert label``'s pair files in any format, the bench's
shards made in memory) would otherwise all be put in the object store before the actor pool
starts: the driver's memory would grow with the input, and past the store's size Ray would
spill it. A spool writes each pending shard to a file of its own on the driver's local disk
(Arrow IPC, lz4), Ray Data tasks on the driver's node read them as the actors are ready for
more (``SpoolSource``), and a shard's file is removed once it is committed. The object store
then holds only the shards in flight.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from augsbert_ray.errors import LabelingError


def shard_path(folder: str | os.PathLike, i: int) -> str:
    return os.path.join(folder, f"shard-{i:06d}.arrow")


def write_table(path: str | os.PathLike, table: pa.Table) -> None:
    """``table`` as an Arrow IPC file (lz4: writing and reading cost far less than labelling),
    written under a temporary name and renamed, so that a reader never sees half a file.

    Raises:
        LabelingError: the file cannot be written (a full disk, a folder removed), naming it.
    """
    tmp = f"{path}.tmp"
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        os.replace(tmp, path)
    except (OSError, pa.ArrowException) as e:
        Path(tmp).unlink(missing_ok=True)
        raise LabelingError(f"{os.path.dirname(os.path.abspath(path))}: cannot keep a shard waiting for its "
                            f"labels there: {e}") from None


def read_table(path: str | os.PathLike) -> pa.Table:
    with pa.OSFile(str(path), "rb") as source:
        return pa.ipc.open_file(source).read_all()


def read_spooled(tasks: pa.Table) -> pa.Table:
    """Runs in a Ray Data task: each task's shards (``SpoolSource.tasks``), read from their files."""
    return pa.concat_tables([read_table(shard_path(task["folder"], i))
                             for task in tasks.to_pylist() for i in task["shards"]])


@dataclass(frozen=True)
class SpoolSource:
    """Where the pool's tasks read spooled shards: ``folder`` on the node ``node_id``."""

    folder: str
    node_id: str

    read = staticmethod(read_spooled)

    def tasks(self, pending: dict) -> list[dict]:
        """Reading tasks over the pending shards, in order, one shard each (as ``pool.FileSource``'s,
        so that each shard is committed as soon as it is labelled)."""
        return [{"folder": self.folder, "shards": [i]} for i in sorted(pending)]

    def block(self, pending) -> pa.Table:
        """One pending shard (a ``driver._Pending``), as the pool's tasks read it."""
        return read_table(shard_path(self.folder, pending.index))


class ShardSpool:
    """The spool's folder, emptied when opened (a killed run's shards are cut again from the
    input) and removed by ``close``."""

    def __init__(self, folder: str | os.PathLike, node_id: str):
        self.folder = Path(folder)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self.source = SpoolSource(str(self.folder.resolve()), node_id)

    def put(self, i: int, block: pa.Table) -> SpoolSource:
        """Writes shard ``i`` (with its ``SHARD`` column); returns where the pool reads it."""
        write_table(shard_path(self.folder, i), block)
        return self.source

    def remove(self, i: int) -> None:
        """Shard ``i`` is committed: its file goes."""
        Path(shard_path(self.folder, i)).unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
