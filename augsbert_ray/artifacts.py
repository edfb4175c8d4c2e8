"""Model files (and other read-only directories, such as a BM25 index) that reach Ray
workers through the object store, not through a shared disk.

A model trained on one node (the cross-encoder, the gold-only bi-encoder) is needed by
actors and tasks that may run on other nodes. ``ship_model`` puts the model directory's
files in Ray's object store once; ``local_model`` on any worker writes them to that
node's temporary directory the first time they are needed (keyed by content digest, so
each node unpacks a model once) and returns the local path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Model files only: weights, configs, tokenizers, pooling settings (no pickles).
_SKIP_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@dataclass(frozen=True)
class ShippedModel:
    """A model directory held in the object store; pass it where a model path goes."""

    name: str  # what it was shipped from, for messages
    digest: str  # sha256 over the files' names and contents
    ref: Any  # ray.ObjectRef of {relative path: bytes}


def ship_model(path: str | os.PathLike) -> ShippedModel:
    """Puts the files of the model directory ``path`` in Ray's object store."""
    import ray

    root = Path(path)
    files: dict[str, bytes] = {}
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        if rel.endswith(_SKIP_SUFFIXES):
            continue
        data = f.read_bytes()
        files[rel] = data
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    if not files:
        raise FileNotFoundError(f"{root}: no model files to ship")
    return ShippedModel(str(root), h.hexdigest(), ray.put(files))


def local_model(model: str | ShippedModel, cache_dir: str | os.PathLike | None = None) -> str:
    """A local path for ``model``: a path or hub id as is, a shipped model unpacked on this node."""
    if not isinstance(model, ShippedModel):
        return model
    import ray

    cache = Path(cache_dir or os.environ.get("AUGSBERT_MODEL_CACHE") or Path(tempfile.gettempdir()) / "augsbert-models")
    target = cache / model.digest
    if target.is_dir():
        return str(target)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model.digest[:12]}-", dir=cache))
    for rel, data in ray.get(model.ref).items():
        out = tmp / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    try:
        os.rename(tmp, target)  # atomic; another process on this node may have won the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def ship_if_local(model: str) -> str | ShippedModel:
    """Ships a local model directory; anything else (a hub id, ``embedded``) stays a name that
    every worker resolves itself. Needs nothing but the directory: no model package."""
    p = Path(model).expanduser()
    return ship_model(p) if p.is_dir() else model
