"""Every use of Ray's private APIs, in one place.

Checked against Ray 2.60 (``CHECKED_WITH``); ``pyproject.toml`` bounds Ray below the next minor
release and ``tests/test_versions.py`` fails on a Ray outside that range. Before raising the
bound, run the tests on the new Ray and check each function here against its source. Each
degrades to Ray's default behaviour where the internal it reads is gone, except the trainer's
overrides, which a test reads from Ray Train's source (``tests/test_signals.py``).
"""

from __future__ import annotations

import os
from typing import Callable

CHECKED_WITH = "2.60"


def system_config(**values) -> dict:
    """``ray.init`` keyword arguments that set Ray's internal system config (``_system_config``)."""
    return {"_system_config": dict(values)}


def set_auto_connect(allowed: bool) -> None:
    """Whether a Ray API call made while no Ray is initialised starts or joins one
    (``ray._private.auto_init_hook.enable_auto_connect``; a user's ``RAY_ENABLE_AUTO_CONNECT=0``
    is kept). Without the flag Ray keeps its default."""
    try:
        from ray._private import auto_init_hook
    except ImportError:
        return
    if hasattr(auto_init_hook, "enable_auto_connect"):
        auto_init_hook.enable_auto_connect = allowed and os.environ.get("RAY_ENABLE_AUTO_CONNECT", "") != "0"


def cluster_flag() -> bool:
    """Ray's in-process copy of its single-host switch (``ray_constants.ENABLE_RAY_CLUSTER``, read
    from the environment when Ray is imported): False keeps a local Ray's processes on 127.0.0.1."""
    from ray._private import ray_constants

    return ray_constants.ENABLE_RAY_CLUSTER


def set_cluster_flag(value: bool) -> None:
    """Sets ``ray_constants.ENABLE_RAY_CLUSTER`` in this process (see ``cluster_flag``)."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = value


def auto_address() -> str | None:
    """Where Ray's address ``auto`` points: the cluster of the last ``ray start`` on this host.

    Raises:
        Exception: Ray's own, where it finds no cluster or several.
    """
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address("auto")


def actor_class_name(handle) -> str:
    """The class name an actor handle was created from ('' where the handle does not say)."""
    return getattr(getattr(handle, "_ray_actor_creation_function_descriptor", None), "class_name", "")


class JobOwnsCtrlC:
    """Ray Train's ``fit`` installs a SIGINT handler (``_register_sigint_handler``) that aborts the
    training run and ends the process with status 1; Ctrl-C ends the whole job instead
    (``augsbert_ray.signals``: status 130, its clean-up), and a re-run resumes the training from
    its latest checkpoint."""

    def _register_sigint_handler(self, controller):
        pass


def lean_torch_trainer(unused: Callable[[object], set[str]]) -> type:
    """A ``TorchTrainer`` that owns no Ctrl-C (``JobOwnsCtrlC``) and leaves out the default
    callbacks whose class names ``unused(trainer)`` returns (``_create_default_callbacks``)."""
    from ray.train.torch import TorchTrainer

    class LeanTorchTrainer(JobOwnsCtrlC, TorchTrainer):
        def _create_default_callbacks(self):
            drop = unused(self)
            return [cb for cb in super()._create_default_callbacks() if type(cb).__name__ not in drop]

    return LeanTorchTrainer
