"""``${NAME}`` and ``${NAME:-default}`` in job files, and what each value was built from.

A default may list folders to search, separated by ``|``:
``${AUGSBERT_DATA_DIR:-~/.cache/augsbert-ray/data|../shared/data}/stsb/sts-train.csv`` is built
with the first of them under which the rest of the value names an existing path (``~``
expanded), or with the first when none does; a set variable is used as it is.

Hand-written: the shell's default syntax is a small regex, and no library both expands it and
records which variables a value came from (what a path that does not resolve reports).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from augsbert_ray.errors import ConfigError


@dataclass(frozen=True)
class EnvReference:
    """A ``${NAME}`` or ``${NAME:-default}`` that a value of the job file was built from.

    Attributes:
        name: the environment variable.
        default: the default written in the job file, or None.
        value: the variable's value when the job was loaded; None when it was not set (and
            the default was used).
    """

    name: str
    default: str | None
    value: str | None


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any, path: str | None, key: str = "", refs: dict | None = None) -> Any:
    """Replaces ``${VAR}`` / ``${VAR:-default}`` in every string of a parsed YAML tree.

    Args:
        value: the tree (or a value inside it).
        path: the job file, for messages.
        key: the dotted key of ``value``.
        refs: if given, filled with the ``EnvReference``s of each dotted key.

    Returns:
        The tree with every reference replaced (``${name}`` is left for the job's own name).

    Raises:
        ConfigError: on a variable that is not set and has no default.
    """
    if isinstance(value, dict):
        return {k: expand_env(v, path, f"{key}.{k}" if key else str(k), refs) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, path, f"{key}[{i}]", refs) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    searched = [m for m in _ENV.finditer(value) if m.group(1) not in os.environ and "|" in (m.group(2) or "")]
    if len(searched) > 1:
        raise ConfigError(path, key, "only one ${NAME:-a|b} search list may be used in a value")

    def sub(m: re.Match, pick: int = 0) -> str:
        name, default = m.group(1), m.group(2)
        if name == "name":  # left for the job's own name (see run_dir)
            return m.group(0)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return os.path.expanduser(default.split("|")[pick]) if "|" in default else default
        raise ConfigError(path, key, f"environment variable {name} is not set and has no default")

    if refs is not None:
        for m in _ENV.finditer(value):
            if m.group(1) != "name":
                refs.setdefault(key, []).append(EnvReference(m.group(1), m.group(2), os.environ.get(m.group(1))))
    if searched:
        built = [_ENV.sub(lambda m: sub(m, i if m.start() == searched[0].start() else 0), value)
                 for i in range(len(searched[0].group(2).split("|")))]
        return next((b for b in built if os.path.exists(b)), built[0])
    return _ENV.sub(sub, value)
