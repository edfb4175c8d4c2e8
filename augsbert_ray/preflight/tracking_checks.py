"""Pre-flight: the module a job's ``tracking.backend`` writes with is installed (before Ray starts).

Kept apart so that a general check of optional modules can take it over: ``MODULES`` says which
module each backend needs and which extra of the package installs it.
"""

from __future__ import annotations

import importlib.util

from augsbert_ray.errors import ConfigError

# backend -> (the module it imports, the package extra that installs it)
MODULES = {"mlflow": ("mlflow", "mlflow"), "tensorboard": ("tensorboard", "tensorboard")}


def check_tracking(cfg) -> None:
    """The tracking backend's module can be imported.

    Raises:
        ConfigError: naming ``tracking.backend``, the missing module and the extra that installs it.
    """
    backend = cfg.tracking.backend
    if backend not in MODULES:
        return
    module, extra = MODULES[backend]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(cfg.source, "tracking.backend",
                          f"{backend} needs the {module} module, which is not installed: "
                          f"pip install 'augsbert-ray[{extra}]' (or set tracking.backend: none)")
