"""Why a configured path does not resolve: where it was looked for and what it was built from."""

from __future__ import annotations

import os
from pathlib import Path

from augsbert_ray.config import JobConfig


def unresolved(cfg: JobConfig, key: str, text: str) -> str:
    """Says where a path that does not resolve was looked for, and what it was built from.

    The absolute path tried; for a relative path, the working directory it was resolved
    from; the environment variables the value came from and whether each was set (the
    shipped job files find their data through
    ``${AUGSBERT_DATA_DIR:-~/.cache/augsbert-ray/data|../shared/data}``);
    and the deepest folder of the path that does exist.
    """
    path = Path(text).expanduser()
    absolute = Path(os.path.abspath(path))
    parts = [str(absolute)]
    if not path.is_absolute():
        parts.append(f"the relative path {text!r} was resolved from the working directory {os.getcwd()}")
    for ref in cfg.env_references(key):
        if ref.value is not None:
            parts.append(f"it is built from ${{{ref.name}}}, which is set to {ref.value!r}")
        elif ref.default is not None and "|" in ref.default:
            folders = ref.default.split("|")
            parts.append(f"it is built from ${{{ref.name}:-{ref.default}}}: {ref.name} is not set and none of "
                         f"{', '.join(folders)} holds it, so the first was used")
        elif ref.default is not None:
            parts.append(f"it is built from ${{{ref.name}:-{ref.default}}} and {ref.name} is not set, so the "
                         f"default {ref.default!r} was used: set {ref.name} to the folder that holds the data")
    existing = next((p for p in absolute.parents if p.is_dir()), None)
    if existing is not None and existing != absolute.parent:
        parts.append(f"the deepest folder of it that exists is {existing}")
    return "; ".join(parts)
