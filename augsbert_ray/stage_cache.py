"""A stage's finished work in the run directory: its folder, its marker, and publishing.

Each stage's outputs live in ``stages/<name>/<fingerprint[:16]>/`` of the run directory with a
marker (``done.json``: the fingerprint, the stage's result and each output's size) written
last, so a folder with a marker is complete. A changed setting gives a new fingerprint, so a
new folder: work of another configuration is never resumed or overwritten (switching a
setting back reuses it).

After a stage completes (or is reused), the outputs it names in ``Stage.publishes`` are
published under fixed names in the run directory (``models/cross-encoder``,
``silver.parquet``...) as hard links, so the latest configuration's artifacts are always
where the README says. Functions over the run directory; ``runner.Runner`` calls them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from augsbert_ray.rundir import RunDir
from augsbert_ray.stages.base import Declaration, Stage, StageResult

log = logging.getLogger(__name__)
MARKER = "done.json"


def folder(rd: RunDir, stage: Stage, fp: str) -> Path:
    """The folder of ``stage``'s work under fingerprint ``fp``."""
    return rd.path("stages", stage.name, fp[:16])


def finished_before(rd: RunDir, stage: Stage, fp: str) -> bool:
    """Whether a marker says ``stage`` finished under ``fp`` (a quick look: ``completed`` also
    checks the outputs)."""
    try:
        return json.loads((folder(rd, stage, fp) / MARKER).read_text(encoding="utf-8")).get("fingerprint") == fp
    except (OSError, ValueError):
        return False


def completed(rd: RunDir, stage: Stage, fp: str) -> dict | None:
    """The marker's record (with ``result`` loaded as the stage's result type) when ``stage``
    finished under ``fp`` and its outputs are as it left them; else None."""
    rel = folder(rd, stage, fp).relative_to(rd.root).as_posix()
    marker = rd.path(rel, MARKER)
    if not marker.exists():
        return None
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if record.get("fingerprint") != fp:
        return None
    changed = [name for name, sig in record.get("outputs", {}).items() if rd.signature(f"{rel}/{name}") != sig]
    if changed:
        log.info(f"[{stage.name}] completed earlier, but {', '.join(changed)} is missing or changed; redoing it")
        return None
    result = stage.load_result(record.get("result"))
    if result is None:
        log.info(f"[{stage.name}] completed earlier, but its recorded result is of another version; redoing it")
        return None
    return {**record, "result": result}


def mark(rd: RunDir, stage: Stage, fp: str, decl: Declaration, result: StageResult, seconds: float) -> None:
    """Writes ``stage``'s marker, last: its outputs' signatures, result and time (and pushes a
    remote run directory).

    Raises:
        RuntimeError: the stage did not write an output it declares.
    """
    rel = folder(rd, stage, fp).relative_to(rd.root).as_posix()
    outputs = {name: rd.signature(f"{rel}/{name}") for name in decl.outputs}
    missing = [name for name, sig in outputs.items() if sig is None]
    if missing:
        raise RuntimeError(f"stage '{stage.name}' did not write {', '.join(missing)}")
    record = {"stage": stage.name, "fingerprint": fp, "seconds": seconds, "result": result.record(),
              "outputs": outputs}
    rd.write_text(f"{rel}/{MARKER}", json.dumps(record, indent=2, default=str))
    rd.push()


def publish(source: Path, target: Path) -> None:
    """Makes ``target`` hold ``source``'s content (a file or a directory tree), as hard links
    where the file system allows (copies elsewhere); replaces whatever ``target`` was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.publishing")
    _remove(tmp)
    if source.is_dir():
        shutil.copytree(source, tmp, copy_function=_link_or_copy)
    else:
        _link_or_copy(source, tmp)
    old = target.with_name(f".{target.name}.old")
    _remove(old)
    if target.exists() or target.is_symlink():
        os.replace(target, old)
    os.replace(tmp, target)
    _remove(old)


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
