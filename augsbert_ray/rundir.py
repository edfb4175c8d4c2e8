"""A job's run directory: where stages keep their outputs, on local disk or shared storage.

Each stage writes into its own folder, ``stages/<name>/<fingerprint>/``, and marks it
complete last (``runner.Runner``); the latest run's outputs are also published under fixed
names (``models/...``, ``silver.parquet``). This module only moves files: atomic writes,
sizes for integrity checks, and the copy to and from remote storage.

The run directory is a local path or a URI on shared storage (``s3://``, ``gs://``, ...,
anything ``pyarrow.fs`` opens). With a URI the job works in a local staging copy
(``AUGSBERT_STAGING_DIR``, default ``~/.cache/augsbert/staging``): it first downloads
what an earlier run left there (markers and artifacts, not Ray's checkpoints), and after
each completed stage uploads what changed, markers last, so a marker on the storage
always means its artifacts are there too. Ray Train and Ray Tune write their checkpoints
straight to the storage, so workers on other nodes need no shared disk. The lock that keeps
a second run out (``run_lock``) lives in the local root too, so for a URI it covers the runs
staged on this machine only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from augsbert_ray.errors import writing

log = logging.getLogger(__name__)


def fingerprint(*parts: Any) -> str:
    """sha256 of a JSON rendering of ``parts`` (dicts are key-sorted)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def table_fingerprint(table: pa.Table) -> str:
    """sha256 of a table's content (its Arrow IPC stream)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue()).hexdigest()  # the buffer itself, not a copy as bytes


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Folders never copied between the staging copy and the storage: Ray Train and Tune write
# their checkpoints to the storage themselves, and a search index is rebuilt when needed.
_NOT_SYNCED = frozenset({"ray", "ray_train", "ray_tune", "index"})


def _synced(rel: str) -> bool:
    return not _NOT_SYNCED.intersection(rel.split("/")[:-1])


def write_table(path: str | os.PathLike, table: pa.Table, schema: pa.Schema | None = None,
                rows_per_write: int = 65_536) -> Path:
    """Writes a table as Parquet atomically (temporary name, then rename); with ``schema``,
    cast to it a slice at a time (dictionary text columns are decoded one slice at a time,
    never whole)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with written_whole(tmp, target):
        if schema is None:
            pq.write_table(table, tmp)
        else:
            with pq.ParquetWriter(tmp, schema) as writer:
                for start in range(0, table.num_rows, rows_per_write):
                    writer.write_table(table.slice(start, rows_per_write).cast(schema))
                if table.num_rows == 0:
                    writer.write_table(schema.empty_table())
    os.replace(tmp, target)
    return target


@contextmanager
def written_whole(tmp: Path, target: Path):
    """Around the write of ``tmp`` (renamed to ``target`` after): a write that fails removes
    ``tmp``, and a full disk is a ``DiskFullError`` naming ``target``."""
    try:
        with writing(target):
            yield
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_uri(location: str | os.PathLike) -> bool:
    """True for ``scheme://...`` locations other than ``file://``."""
    text = str(location)
    return bool(_URI.match(text)) and not text.startswith("file://")


def join_location(location: str | os.PathLike, *names: str) -> str:
    """``names`` under a folder given as a path or a URI (a URI's query, such as pyarrow's
    ``?endpoint_override=...``, stays at its end)."""
    text = str(location)
    if not _URI.match(text):
        return str(Path(text).joinpath(*names))
    base, sep, query = text.partition("?")
    return "/".join([base.rstrip("/"), *names]) + sep + query


STORAGE_TIMEOUT_S = 15.0


def check_storage(uri: str, timeout_s: float = STORAGE_TIMEOUT_S) -> None:
    """Refuses a run directory URI that ``pyarrow.fs`` cannot open, or whose storage does not
    answer within ``timeout_s`` (offline, a bucket that does not exist, no credentials): the
    job would otherwise fail or wait after loading its data.

    Raises:
        AugSBERTError: naming the URI and what went wrong.
    """
    import threading

    import pyarrow as pa
    import pyarrow.fs as pafs

    from augsbert_ray.errors import AugSBERTError

    scheme = uri.split("://", 1)[0].lower()
    outcome: dict = {}

    def probe() -> None:
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
            outcome["info"] = fs.get_file_info(path)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            outcome["error"] = e

    # A daemon thread: a storage client that never answers must not keep the process alive.
    thread = threading.Thread(target=probe, name="augsbert-storage-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise AugSBERTError(f"run directory {uri}: the storage did not answer within {timeout_s:g} s (offline? "
                            "credentials? the bucket's region?)")
    error = outcome.get("error")
    if isinstance(error, (pa.ArrowInvalid, pa.ArrowNotImplementedError)) and "filesystem" in str(error).lower():
        raise AugSBERTError(f"run directory {uri}: '{scheme}://' is not a storage this installation can open "
                            "(pyarrow.fs opens s3://, gs://, hdfs://, abfs://, file://; a local directory is a "
                            "plain path)") from None
    if error is not None:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise AugSBERTError(f"run directory {uri}: the storage cannot be used: {first}") from None
    info = outcome["info"]
    if info.type == pafs.FileType.File:
        raise AugSBERTError(f"run directory {uri}: is a file, not a directory")


def local_root(location: str | os.PathLike) -> Path:
    """Where a run directory's files are on this machine: the directory itself, or for a
    storage URI its local staging copy."""
    if not is_uri(location):
        return Path(location).absolute()
    staging = os.environ.get("AUGSBERT_STAGING_DIR") or Path.home() / ".cache" / "augsbert" / "staging"
    return Path(staging).absolute() / hashlib.sha256(str(location).rstrip("/").encode()).hexdigest()[:16]


class RunDir:
    def __init__(self, root: str | os.PathLike):
        self.uri = str(root).rstrip("/") if is_uri(root) else None
        self.root = local_root(root)
        if self.uri is None:
            # Created by the first write: a job that fails its input checks leaves nothing behind.
            self.preexisting = self.root.exists()
            return
        self.preexisting = True
        self.root.mkdir(parents=True, exist_ok=True)
        import pyarrow.fs as pafs

        self.fs, self.remote = pafs.FileSystem.from_uri(self.uri)
        staging = os.environ.get("AUGSBERT_STAGING_DIR") or Path.home() / ".cache" / "augsbert" / "staging"
        self.root = Path(staging).absolute() / hashlib.sha256(self.uri.encode()).hexdigest()[:16]
        self.preexisting = True
        self.root.mkdir(parents=True, exist_ok=True)
        self._synced: dict[str, tuple[int, int]] = {}
        self.pull()

    @property
    def location(self) -> str:
        """Where the run directory lives: its URI, or its local path."""
        return self.uri or str(self.root)

    def storage(self, name: str) -> str:
        """A location under the run directory that Ray workers write to themselves (Ray Train and
        Tune checkpoints, labelling shards): on the storage when the run directory is remote."""
        return join_location(self.uri, name) if self.uri else str(self.path(name))

    # -- remote storage ------------------------------------------------------------------
    def _local_files(self) -> dict[str, tuple[int, int]]:
        out = {}
        for p in self.root.rglob("*"):
            rel = p.relative_to(self.root).as_posix()
            if p.is_file() and not p.name.startswith(".") and _synced(rel):
                st = p.stat()
                out[rel] = (st.st_size, st.st_mtime_ns)
        return out

    def pull(self) -> None:
        """Downloads the remote run directory's files that the staging copy lacks or has differently."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.remote, recursive=True, allow_not_found=True))
        remote = {info.path[len(self.remote):].lstrip("/"): info for info in infos if info.type == pafs.FileType.File}
        # The storage is the truth: a marker the staging copy has but the storage lacks is stale.
        for marker in self.root.glob("stages/*/*/done.json"):
            if marker.relative_to(self.root).as_posix() not in remote:
                marker.unlink()
        n = 0
        for rel, info in remote.items():
            if not _synced(rel):
                continue
            local = self.path(rel)
            # Large files (models, tables) are compared by size; small ones (markers) always fetched.
            if local.exists() and local.stat().st_size == info.size and info.size > 1 << 20:
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            tmp = local.with_name(f".{local.name}.part")
            with self.fs.open_input_stream(info.path) as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            os.replace(tmp, local)
            n += 1
        self._synced = self._local_files()
        if n:
            log.info(f"[augsbert] fetched {n} file(s) of an earlier run from {self.uri}")

    def push(self) -> None:
        """Uploads new or changed files to the remote run directory; stage markers go last."""
        if self.uri is None:
            return
        now = self._local_files()
        changed = sorted((rel for rel, sig in now.items() if self._synced.get(rel) != sig),
                         key=lambda rel: rel.endswith("/done.json"))  # markers last
        for rel in changed:
            target = f"{self.remote}/{rel}"
            self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            with open(self.path(rel), "rb") as src, self.fs.open_output_stream(target) as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            self._synced[rel] = now[rel]

    def remove_tree(self, name: str) -> None:
        """Deletes a directory of the run dir, on the storage too."""
        import shutil

        shutil.rmtree(self.path(name), ignore_errors=True)
        if self.uri is None:
            return
        import pyarrow.fs as pafs

        if self.fs.get_file_info(f"{self.remote}/{name}").type == pafs.FileType.Directory:
            self.fs.delete_dir(f"{self.remote}/{name}")
        self._synced = {rel: sig for rel, sig in self._synced.items() if not rel.startswith(f"{name}/")}

    def discard(self, rel: str) -> None:
        """Removes a folder of the run dir, and the run dir itself if this job created it and
        nothing else is in it (a job that failed before doing anything leaves no trace)."""
        import shutil

        shutil.rmtree(self.path(rel), ignore_errors=True)
        folder = self.path(rel).parent
        while folder != self.root and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
        if not self.preexisting and self.root.is_dir() and not any(self.root.iterdir()):
            self.root.rmdir()

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def write_text(self, name: str, text: str) -> Path:
        """Writes a file atomically (temporary name, then rename)."""
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        with written_whole(tmp, target):
            tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return target

    def write_table(self, name: str, table: pa.Table, schema: pa.Schema | None = None,
                    rows_per_write: int = 65_536) -> Path:
        """Writes a table of the run dir as Parquet atomically (see ``write_table``)."""
        return write_table(self.path(name), table, schema, rows_per_write)

    def read_table(self, name: str) -> pa.Table:
        return pq.read_table(self.path(name))

    def signature(self, rel: str) -> list | None:
        """[files, bytes] of a file or directory of the run dir; None when it is missing."""
        path = self.path(rel)
        if path.is_file():
            return [1, path.stat().st_size]
        if path.is_dir():
            files = [p for p in path.rglob("*") if p.is_file()]
            return [len(files), sum(p.stat().st_size for p in files)] if files else None
        return None
