"""A job's run directory: fixed artifact paths, and a marker per completed stage.

Each stage's marker stores a fingerprint of everything the stage depends on (its
config, its inputs' fingerprints). Re-running a job skips a stage whose marker matches
and redoes it, and everything downstream, when anything it depends on changed.

The run directory is a local path or a URI on shared storage (``s3://``, ``gs://``, ...,
anything ``pyarrow.fs`` opens). With a URI the job works in a local staging copy
(``AUGSBERT_STAGING_DIR``, default ``~/.cache/augsbert/staging``): it first downloads
what an earlier run left there (markers and artifacts, not Ray's checkpoints), and after
each completed stage uploads what changed, markers last, so a marker on the storage
always means its artifacts are there too. Ray Train and Ray Tune write their checkpoints
straight to the storage, so workers on other nodes need no shared disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def fingerprint(*parts: Any) -> str:
    """sha256 of a JSON rendering of ``parts`` (dicts are key-sorted)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def table_fingerprint(table: pa.Table) -> str:
    """sha256 of a table's content (its Arrow IPC stream)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_NOT_SYNCED = ("ray_train/", "ray_tune/", "index/")  # Ray writes its own; the index is rebuilt


def is_uri(location: str | os.PathLike) -> bool:
    """True for ``scheme://...`` locations other than ``file://``."""
    text = str(location)
    return bool(_URI.match(text)) and not text.startswith("file://")


def local_root(location: str | os.PathLike) -> Path:
    """Where a run directory's files are on this machine: the directory itself, or for a
    storage URI its local staging copy."""
    if not is_uri(location):
        return Path(location).absolute()
    staging = os.environ.get("AUGSBERT_STAGING_DIR") or Path.home() / ".cache" / "augsbert" / "staging"
    return Path(staging).absolute() / hashlib.sha256(str(location).rstrip("/").encode()).hexdigest()[:16]


class RunDir:
    def __init__(self, root: str | os.PathLike, log=lambda line: None):
        self.uri = str(root).rstrip("/") if is_uri(root) else None
        self.log = log
        self.root = local_root(root)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.uri is None:
            return
        import pyarrow.fs as pafs

        self.fs, self.remote = pafs.FileSystem.from_uri(self.uri)
        self._synced: dict[str, tuple[int, int]] = {}
        self.pull()

    @property
    def location(self) -> str:
        """Where the run directory lives: its URI, or its local path."""
        return self.uri or str(self.root)

    def storage(self, name: str) -> str:
        """A location for Ray Train / Tune storage under the run directory (remote when it is)."""
        return f"{self.uri}/{name}" if self.uri else str(self.path(name))

    # -- remote storage ------------------------------------------------------------------
    def _local_files(self) -> dict[str, tuple[int, int]]:
        out = {}
        for p in self.root.rglob("*"):
            rel = p.relative_to(self.root).as_posix()
            if p.is_file() and not p.name.startswith(".") and not rel.startswith(_NOT_SYNCED):
                st = p.stat()
                out[rel] = (st.st_size, st.st_mtime_ns)
        return out

    def pull(self) -> None:
        """Downloads the remote run directory's files that the staging copy lacks or has differently."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.remote, recursive=True, allow_not_found=True))
        remote = {info.path[len(self.remote):].lstrip("/"): info for info in infos if info.type == pafs.FileType.File}
        # The storage is the truth: a marker the staging copy has but the storage lacks is stale.
        for marker in self.root.glob("stages/*.json"):
            if f"stages/{marker.name}" not in remote:
                marker.unlink()
        n = 0
        for rel, info in remote.items():
            if rel.startswith(_NOT_SYNCED):
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
            self.log(f"[augsbert] fetched {n} file(s) of an earlier run from {self.uri}")

    def push(self) -> None:
        """Uploads new or changed files to the remote run directory; stage markers go last."""
        if self.uri is None:
            return
        now = self._local_files()
        changed = sorted((rel for rel, sig in now.items() if self._synced.get(rel) != sig),
                         key=lambda rel: rel.startswith("stages/"))
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

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def write_text(self, name: str, text: str) -> Path:
        """Writes a file atomically (temporary name, then rename)."""
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return target

    def write_table(self, name: str, table: pa.Table, schema: pa.Schema | None = None,
                    rows_per_write: int = 65_536) -> Path:
        """Writes a table as Parquet atomically; with ``schema``, cast to it a slice at a time
        (dictionary text columns are decoded one slice at a time, never whole)."""
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
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

    def read_table(self, name: str) -> pa.Table:
        return pq.read_table(self.path(name))

    def _marker(self, stage: str) -> Path:
        return self.path("stages", f"{stage}.json")

    def completed(self, stage: str, fp: str) -> dict | None:
        """The recorded result of ``stage`` if it completed with this fingerprint and its outputs
        are as it wrote them, else None."""
        marker = self._marker(stage)
        if not marker.exists():
            return None
        record = json.loads(marker.read_text(encoding="utf-8"))
        if record.get("fingerprint") != fp:
            return None
        changed = [rel for rel, sig in record.get("outputs", {}).items() if self._signature(rel) != sig]
        if changed:
            self.log(f"[{stage}] completed earlier, but {', '.join(changed)} is missing or changed; redoing it")
            return None
        return record["result"]

    def mark_completed(self, stage: str, fp: str, result: dict, outputs=()) -> None:
        """Writes the stage's marker (last, after its outputs), with the signature of each output."""
        signatures = {rel: self._signature(rel) for rel in outputs if not Path(rel).is_absolute()}
        self.write_text(f"stages/{stage}.json",
                        json.dumps({"fingerprint": fp, "result": result, "outputs": signatures}, indent=2))
        self.push()

    def _signature(self, rel: str) -> list | None:
        """[files, bytes] of a file or directory of the run dir; None when it is missing."""
        path = self.path(rel)
        if path.is_file():
            return [1, path.stat().st_size]
        if path.is_dir():
            files = [p for p in path.rglob("*") if p.is_file()]
            return [len(files), sum(p.stat().st_size for p in files)] if files else None
        return None
