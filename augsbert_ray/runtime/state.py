"""What ``start_ray`` changed in this process, kept in one place so that ``stop_ray`` can
put it back: the local Ray it started, the settings it changed, the address it pinned."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Settings:
    """Settings start_ray changed, with their values before."""

    verbose: bool = True
    env: dict = field(default_factory=dict)  # name -> value before (None: unset)
    handlers: list = field(default_factory=list)  # (logger, handler, level before, removed)
    added: list = field(default_factory=list)  # (logger, handler) that start_ray added
    data_context: dict = field(default_factory=dict)


# The local Ray this process started ({"session": its session directory}); None when it
# started none (or connected to a cluster).
local: dict | None = None
settings = Settings()
pinned: dict = {}  # the RAY_ADDRESS start_ray set in this process, and the value before
owned: list = []  # non-empty while the Ray of this process is one start_ray started or joined


def set_env(values: dict[str, str], only_unset: bool) -> None:
    """Sets environment variables, remembering their values before (for ``restore_ray_output``)."""
    for name, value in values.items():
        if only_unset and name in os.environ:
            continue  # the user's setting wins
        settings.env.setdefault(name, os.environ.get(name))
        os.environ[name] = value
