"""Model files (and other read-only directories, such as a BM25 index) that reach Ray
workers through the object store, not through a shared disk.

A model trained on one node (the cross-encoder, the gold-only bi-encoder) is needed by
actors and tasks that may run on other nodes. ``ship_directory`` (``models.ship_model`` for
a model) puts the directory's
files in Ray's object store once; ``local_model`` on any worker writes them to that node's
model cache the first time they are needed and returns the local path.

The cache is private to the user and to the job:

- it lives in ``$AUGSBERT_MODEL_CACHE``, else ``$XDG_CACHE_HOME/augsbert/models``, else
  ``~/.cache/augsbert/models`` (never a folder shared by every user, such as ``/tmp``),
  created owner-only (0700); a cache folder that is a symbolic link, belongs to another user
  or is writable by others is refused;
- each job (driver process) unpacks into its own subfolder ``job-<pid>-<random>/<digest>/``,
  and a copy is used only after its files' digest is recomputed and matches the shipped one
  (a copy that does not match is removed and unpacked again, never used);
- ``cleanup_shipped`` removes the job's subfolder on every live node at the end of the job
  (the CLI calls it, also on errors and signals; a process that ships a model also runs it
  at exit, for scripts that call ``run_job`` themselves). What a job killed with SIGKILL
  leaves behind is removed by a later job on that node once it has not been used for
  ``STALE_AFTER_S`` (a day).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import secrets
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from augsbert_ray.errors import AugSBERTError

log = logging.getLogger(__name__)

CACHE_ENV = "AUGSBERT_MODEL_CACHE"
STALE_AFTER_S = 24 * 3600
# This driver process's subfolder of every node's cache: unique per job, so that removing it
# never pulls a model from under another job of the same user.
JOB_FOLDER = f"job-{os.getpid()}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class ShippedModel:
    """A model directory held in the object store; pass it where a model path goes."""

    name: str  # what it was shipped from, for messages
    digest: str  # sha256 over the files' names and contents (``tree_digest``)
    ref: Any  # ray.ObjectRef of {relative path: bytes}
    job: str = JOB_FOLDER  # the cache subfolder it is unpacked into on each node


def _digest(files: dict[str, bytes] | list[tuple[str, bytes]]) -> str:
    items = sorted(files.items() if isinstance(files, dict) else files)
    h = hashlib.sha256()
    for rel, data in items:
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def tree_digest(root: Path) -> str:
    """The digest of every file under ``root`` (names and contents), as ``ship_directory`` computes it."""
    return _digest([(f.relative_to(root).as_posix(), f.read_bytes()) for f in root.rglob("*") if f.is_file()])


def ship_directory(path: str | os.PathLike, skip_suffixes: tuple[str, ...] = ()) -> ShippedModel:
    """Puts the files of directory ``path`` (those not ending in ``skip_suffixes``) in Ray's object store.

    Raises:
        AugSBERTError: the directory has no files to ship.
    """
    import ray

    root = Path(path)
    files = {f.relative_to(root).as_posix(): f.read_bytes()
             for f in sorted(p for p in root.rglob("*") if p.is_file()) if not f.name.endswith(skip_suffixes)}
    if not files:
        raise AugSBERTError(f"{root}: no files to ship")
    _cleanup_at_exit()
    return ShippedModel(str(root), _digest(files), ray.put(files))


_at_exit: list[bool] = []


def _cleanup_at_exit() -> None:
    # Registered after ray.init, so it runs before Ray's own exit handler shuts Ray down:
    # the other nodes can still be reached.
    if not _at_exit:
        atexit.register(cleanup_shipped)
        _at_exit.append(True)


def cache_root() -> Path:
    """This user's model cache on this node (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "augsbert" / "models"


def private_dir(path: Path) -> Path:
    """Creates ``path`` owner-only (0700), or checks that an existing one is this user's alone.

    Raises:
        AugSBERTError: ``path`` is a symbolic link, belongs to another user, or other users
            can write to it (they could plant files that a job would load as a model).
    """
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    fix = f"use a folder of your own (set {CACHE_ENV})"
    if stat.S_ISLNK(st.st_mode):
        raise AugSBERTError(f"{path}: the model cache is a symbolic link; refusing it: {fix}")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise AugSBERTError(f"{path}: the model cache belongs to another user (uid {st.st_uid}); refusing it: {fix}")
    if st.st_mode & 0o022:
        raise AugSBERTError(f"{path}: other users can write to the model cache (mode {stat.S_IMODE(st.st_mode):04o}); "
                            f"refusing it: chmod 700 it, or {fix}")
    return path


def local_model(model: str | ShippedModel, cache_dir: str | os.PathLike | None = None) -> str:
    """A local path for ``model``: a path or hub id as is, a shipped model unpacked on this node.

    An existing copy is used only if its digest matches; otherwise it is replaced.

    Raises:
        AugSBERTError: the cache folder is not private to this user (``private_dir``).
    """
    if not isinstance(model, ShippedModel):
        return model
    import ray

    root = private_dir(Path(cache_dir) if cache_dir else cache_root())
    job = private_dir(root / model.job)
    os.utime(job)  # in use: a later job's sweep of stale folders leaves it alone
    target = job / model.digest
    if target.is_dir():
        if tree_digest(target) == model.digest:
            return str(target)
        log.warning("%s: the unpacked copy of %s does not match its digest; unpacking it again", target, model.name)
        shutil.rmtree(target, ignore_errors=True)
    else:
        _sweep_stale(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model.digest[:12]}-", dir=job))
    for rel, data in ray.get(model.ref).items():
        out = tmp / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    try:
        os.rename(tmp, target)  # atomic; another process on this node may have won the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _sweep_stale(root: Path, now: float | None = None) -> None:
    """Removes other jobs' subfolders not used for ``STALE_AFTER_S`` (jobs killed before their cleanup)."""
    now = time.time() if now is None else now
    for old in root.glob("job-*"):
        try:
            if old.name != JOB_FOLDER and now - old.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            continue  # removed meanwhile by another process


def remove_job_copies(job: str = JOB_FOLDER, cache_dir: str | os.PathLike | None = None) -> bool:
    """Removes this node's unpacked copies of one job; True if there were any."""
    folder = (Path(cache_dir) if cache_dir else cache_root()) / job
    if not folder.is_dir() or folder.is_symlink():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def cleanup_shipped(job: str = JOB_FOLDER, timeout_s: float = 60) -> int:
    """Removes the copies this job unpacked, on this node and on every other live Ray node.

    Each other node runs a small task pinned to it (``NodeAffinitySchedulingStrategy``, no
    CPU). A node that has died, or does not answer within ``timeout_s``, keeps its copies
    until a later job's sweep (``STALE_AFTER_S``).

    Returns:
        The number of nodes where copies were removed.
    """
    removed = int(remove_job_copies(job))
    try:
        ray = sys.modules.get("ray")  # a job that failed before Ray started need not import it here
        if ray is None or not ray.is_initialized():
            return removed
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        remote = ray.remote(num_cpus=0)(remove_job_copies)
        refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(job)
                for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        for ref in done:
            try:
                removed += int(ray.get(ref))
            except Exception as e:  # a node lost meanwhile: its sweep removes the copies later
                log.warning("model cache cleanup on a node failed: %s", e)
    except Exception as e:  # cleanup must never hide the job's own outcome
        log.warning("model cache cleanup failed: %s", e)
    return removed
