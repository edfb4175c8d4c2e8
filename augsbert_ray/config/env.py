"""``${NAME}`` and ``${NAME:-default}`` in job files, and what each value was built from.

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

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name == "name":  # left for the job's own name (see run_dir)
            return m.group(0)
        if refs is not None:
            refs.setdefault(key, []).append(EnvReference(name, default, os.environ.get(name)))
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(path, key, f"environment variable {name} is not set and has no default")

    return _ENV.sub(sub, value)
