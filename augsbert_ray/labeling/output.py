"""The output folder of ``augsbert label``: scored shards, each committed once, that a re-run resumes from.

    OUT/part-000000.parquet ...   a shard's input rows, every column, then the score
    OUT/_label.json               what was labelled with what (model, inputs, columns, settings),
                                  and once every shard is in, the summary
    OUT/_manifests/part-*.json    each shard's commit record (``labeling.ShardStore``)
    OUT/_logs/                    the progress lines (label.log) and Ray's own messages (ray.log)
    OUT/.augsbert.lock            claimed by the run that writes the folder (``run_lock.RunLock``)
    OUT/_staging/                 while a run lasts: the shards not yet committed, their pairs and
                                  their input rows (``labeling.spool``), each removed at its commit;
                                  what a killed run left is cleared by the next

Readers of a folder (pyarrow, Ray Data, pandas) skip names that start with ``_`` or ``.``,
so ``pyarrow.parquet.read_table(OUT)`` reads the scored pairs and nothing else. A part is
written under a temporary name and renamed, then its manifest: a run killed at any point
leaves each shard either committed or redone by the next run, never half there. A re-run
with other inputs, another model or other settings would mix two labellings in one folder,
so it is refused (``fresh`` starts the folder over).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.errors import AugSBERTError, LabelingError
from augsbert_ray.labeling import ShardStore
from augsbert_ray.labeling.spool import read_table, shard_path, write_table

RECORD = "_label.json"
MANIFESTS = "_manifests"
LOGS = "_logs"
STAGING = "_staging"


@dataclass
class LabelSummary:
    """What ``augsbert_ray.label`` did.

    Attributes:
        out: the output folder.
        files: input files read.
        pairs: pairs in all (one output row each).
        shards: shards in all; ``reused_shards`` of them committed by an earlier run.
        labelled_pairs: pairs scored by this run.
        seconds: this run's labelling time (from the first shard handed out to the last committed).
        pairs_per_s: ``labelled_pairs / seconds``.
        first_shard_seconds: from the start of labelling to the first shard back (actors
            started, models loaded): the fixed cost, paid whatever the number of pairs.
        actors: labelling actors in the pool.
    """

    out: str
    files: int
    pairs: int
    shards: int
    reused_shards: int
    labelled_pairs: int
    seconds: float
    pairs_per_s: float
    first_shard_seconds: float | None
    actors: int


class LabelStore(ShardStore):
    """A ``ShardStore`` whose committed shards are the output: the input rows with their score.

    The labelling pipeline commits a shard's labelled candidates (sorted by ``(id1, id2)``,
    which is input order); the store writes the shard's input rows, held since it was read
    (``hold``), with the labels as the score column.

    Args:
        root: the output folder.
        score_column: the name of the score column.
        staging: a folder where the rows of shards not yet committed wait (emptied first); None:
            they are held in memory.
    """

    def __init__(self, root: str | os.PathLike, score_column: str, staging: str | os.PathLike | None = None):
        super().__init__(root)
        (self.root / MANIFESTS).mkdir(exist_ok=True)
        self.score_column = score_column
        self.staging = Path(staging) if staging is not None else None
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging.mkdir(parents=True)
        self._held: dict[int, tuple[pa.Table | str, int]] = {}

    def manifest(self, i: int) -> Path:
        return self.root / MANIFESTS / f"part-{i:06d}.json"

    def hold(self, i: int, rows: pa.Table, first_row: int) -> None:
        """Keeps shard ``i``'s input rows until it is committed: in memory until ``done`` says it
        is not committed yet, then in the staging folder (if any)."""
        self._held[i] = (rows, first_row)

    def done(self, i: int, digest: str) -> bool:
        committed = super().done(i, digest)
        if committed:
            self._held.pop(i, None)  # an earlier run's commit: its rows are not needed
        elif self.staging is not None and i in self._held:
            rows, first = self._held[i]
            if isinstance(rows, pa.Table):  # not yet on disk
                path = shard_path(self.staging, i)
                write_table(path, rows)
                self._held[i] = (path, first)
        return committed

    def commit(self, i: int, table: pa.Table, digest: str) -> None:
        held, first = self._held.pop(i)
        rows = read_table(held) if isinstance(held, str) else held
        expect = np.arange(first, first + rows.num_rows)
        if table.num_rows != rows.num_rows or not np.array_equal(table.column(schema.ID2).to_numpy(), expect):
            raise LabelingError(f"shard {i}: the labelled pairs are not the shard's rows in input order")
        super().commit(i, rows.append_column(pa.field(self.score_column, pa.float32()),
                                              table.column(schema.LABEL).cast(pa.float32())), digest)
        if isinstance(held, str):
            os.unlink(held)


def check_output(out: str | os.PathLike, record: dict, fresh: bool) -> None:
    """Checks that ``out`` can take this labelling, writing nothing.

    Raises:
        AugSBERTError: ``out`` is a file or a storage URI; a folder holding other files; or
            (unless ``fresh``) the output of another labelling, naming what differs.
    """
    from augsbert_ray.rundir import is_uri

    if is_uri(out):
        raise AugSBERTError(f"--out {out}: the output folder must be on local disk (inputs may be storage URIs)")
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise AugSBERTError(f"--out {out}: is a file, not a folder")
    from augsbert_ray.run_lock import LOCK_NAME

    if not root.is_dir() or not [p for p in root.iterdir() if p.name != LOCK_NAME]:
        return
    before = read_record(root)
    if before is None:
        raise AugSBERTError(f"--out {out}: holds other files, not the output of augsbert label; name a new or "
                            "empty folder")
    if fresh:
        return
    differ = [key for key in record if before.get("settings", {}).get(key) != record[key]]
    if differ:
        raise AugSBERTError(f"--out {out}: holds the output of another labelling ({', '.join(differ)} differ); "
                            "name another folder, or pass --fresh to start this one over")


def read_record(root: Path) -> dict | None:
    try:
        record = json.loads((Path(root) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def open_output(out: str | os.PathLike, record: dict, fresh: bool) -> Path:
    """Makes the output folder ready (after ``check_output``): with ``fresh``, removes an earlier
    labelling's parts; writes the settings record. Returns the folder."""
    root = Path(out)
    if fresh:
        for part in root.glob("part-*.parquet"):
            part.unlink()
        shutil.rmtree(root / MANIFESTS, ignore_errors=True)
    for tmp in root.glob(".part-*.tmp"):  # what a killed run was writing
        tmp.unlink()
    write_record(root, {"settings": record, "summary": None})
    return root


def write_record(root: Path, record: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, root / RECORD)


def discard_if_empty(root: Path) -> None:
    """Removes what ``open_output`` and a run wrote into ``root`` where no shard was committed."""
    if any(root.glob("part-*.parquet")):
        return
    (root / RECORD).unlink(missing_ok=True)
    for folder in (MANIFESTS, LOGS, STAGING):
        shutil.rmtree(root / folder, ignore_errors=True)


def finish_output(root: Path, summary: LabelSummary) -> None:
    """Adds the summary to the settings record: the folder holds every shard."""
    record = read_record(root) or {}
    record["summary"] = asdict(summary)
    write_record(root, record)
