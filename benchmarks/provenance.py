"""What every benchmark result closes with: the command, the machine, the versions and the time.

Benchmarks import it as a sibling module (``from provenance import provenance, write_result``):
they run as scripts from this folder.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from augsbert_ray.bench.hardware import cpu_description  # noqa: F401 (benchmarks import it from here)
from augsbert_ray.versions import versions


def provenance(script: str, argv: list[str] | None, machine: str = "", extra: str = "") -> list[str]:
    """A benchmark result's closing lines: the command, the machine, the versions and the time.

    Args:
        script: the program, e.g. ``benchmarks/bm25_speed.py``.
        argv: its arguments (None: ``sys.argv[1:]``).
        machine: what to add to the machine's description (a GPU's name).
        extra: versions of other libraries, e.g. ``", faiss 1.9"``.
    """
    v = versions()
    return [f"Command: `python {script} {' '.join(sys.argv[1:] if argv is None else argv)}`".rstrip("` ") + "`",
            f"Machine: {platform.machine()}, {cpu_description()}, {os.cpu_count()} cores"
            f"{', ' + machine if machine else ''}. Versions: "
            + ", ".join(f"{k} {v[k]}" for k in v) + f"{extra}.",
            f"Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.", ""]


def write_result(out, lines: list[str], data: dict) -> None:
    """Writes a benchmark's table (``out``.md) and its figures with the versions (``out``.json)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({**data, "versions": versions()}, indent=2, default=str))
