"""Test-only: Ray's logical GPUs, with the models on the CPU (tests/test_gpu_placement.py).

Ray schedules GPUs as numbers, so a local Ray started with ``num_gpus=N`` places work on a
machine without a GPU exactly as on one with N. What runs there must then use the CPU: with
``AUGSBERT_TEST_GPUS_ON_CPU=1`` in the environment and this folder on ``PYTHONPATH``, every
Python process of the test's Ray (Ray starts its workers with the driver's environment)
imports this module at start-up, and once torch is imported:

- ``torch.cuda.is_available()`` is False, so the engine's device choice falls back to the CPU
  (already so with a CPU build of torch; on a machine with a GPU it keeps the scores the CPU's);
- ``torch.distributed.init_process_group`` given NCCL (Ray Train's backend for workers that
  hold a GPU) uses gloo, which runs on the CPU.

The package never imports this module; the fixture that starts such a Ray calls ``install``
in the test process itself, which started before the variable was set.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

ENV = "AUGSBERT_TEST_GPUS_ON_CPU"


_originals: list = []  # (object, attribute, value before), for uninstall


def _replace(obj, name: str, value) -> None:
    _originals.append((obj, name, getattr(obj, name)))
    setattr(obj, name, value)


def patch_torch(torch) -> None:
    if _originals:
        return
    _replace(torch.cuda, "is_available", lambda: False)
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    original = dist.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        if isinstance(backend, str) and "nccl" in backend:
            backend = "gloo"
        return original(backend, *args, **kwargs)

    _replace(dist, "init_process_group", init_process_group)


class _AfterTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches torch as soon as its import has run (without importing it in processes that never do)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        patch_torch(module)


def install() -> None:
    """Applies the patches in this process: now if torch is imported, else when it is."""
    if "torch" in sys.modules:
        patch_torch(sys.modules["torch"])
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


def uninstall() -> None:
    """Puts back what ``install`` changed in this process."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorch)]
    while _originals:
        obj, name, value = _originals.pop()
        setattr(obj, name, value)


if os.environ.get(ENV) == "1":
    install()
