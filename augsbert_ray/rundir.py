"""A job's run directory: fixed artifact paths, and a marker per completed stage.

Each stage's marker stores a fingerprint of everything the stage depends on (its
config, its inputs' fingerprints). Re-running a job skips a stage whose marker matches
and redoes it, and everything downstream, when anything it depends on changed.
"""

from __future__ import annotations

import hashlib
import json
import os
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


class RunDir:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).absolute()
        self.root.mkdir(parents=True, exist_ok=True)

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

    def write_table(self, name: str, table: pa.Table) -> Path:
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, target)
        return target

    def read_table(self, name: str) -> pa.Table:
        return pq.read_table(self.path(name))

    def _marker(self, stage: str) -> Path:
        return self.path("stages", f"{stage}.json")

    def completed(self, stage: str, fp: str) -> dict | None:
        """The recorded result of ``stage`` if it completed with this fingerprint, else None."""
        marker = self._marker(stage)
        if not marker.exists():
            return None
        record = json.loads(marker.read_text(encoding="utf-8"))
        return record["result"] if record.get("fingerprint") == fp else None

    def mark_completed(self, stage: str, fp: str, result: dict) -> None:
        self.write_text(f"stages/{stage}.json", json.dumps({"fingerprint": fp, "result": result}, indent=2))
