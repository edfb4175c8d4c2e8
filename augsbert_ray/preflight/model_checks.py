"""Pre-flight checks of the configured models: they load, and they can do what the job asks.

Run before Ray starts (``preflight.check_job``); each failure is one ``ConfigError`` naming the
job file, the key and the model's file:

- a local folder loads the way the job will load it, and its weights files are whole
  (``models.check_local_weights``, which reads the safetensors headers);
- a hub id, while the hub is off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``), is in the
  local Hugging Face cache, with whole weights;
- ``bi_encoder.num_layers`` is no more than the model's layers, and each encoder's
  ``max_length`` no more than its position embeddings (both read from ``config.json``).

A hub id while the hub is on is checked when it is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

from augsbert_ray.config import EMBEDDED_MODEL, JobConfig
from augsbert_ray.errors import AugSBERTError, ConfigError, ModelError
from augsbert_ray.preflight.missing_paths import unresolved

# Position embeddings a model reserves before the first token's (RoBERTa's family counts
# from its padding id + 1), by config.json's model_type.
# Encoders that number positions from padding_idx + 1, as fairseq did: the first pad_token_id + 1
# of their max_position_embeddings never hold a token (RoBERTa's 514 positions read 512 tokens).
_POSITION_OFFSET_TYPES = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "longformer",
                          "roberta-prelayernorm", "xmod", "data2vec-text", "ibert", "luke")
_TRUE = ("1", "on", "yes", "true")


def check_models(cfg: JobConfig) -> None:
    """Every configured model loads and can do what the job asks of it (see the module).

    ``cross_encoder.model`` is read by transformers from its root; ``bi_encoder.model`` by
    sentence-transformers (its Transformer module may sit in a subfolder). A name that is
    written as a path (``./x``, ``/x``, ``~/x``, or more than one ``/``) must be a folder; any
    other name that is not a folder is a hub id.

    Raises:
        ConfigError: naming the job file, the key, the model's file and what is wrong.
    """
    for encoder, sentence_transformers in (("cross_encoder", False), ("bi_encoder", True)):
        found = check_model(cfg, f"{encoder}.model", getattr(cfg, encoder).model,
                            sentence_transformers=sentence_transformers)
        if found is not None:
            check_limits(cfg, encoder, *found)
        if encoder == "cross_encoder" and not cfg.cross_encoder.train:
            check_given_teacher(cfg, found)


def check_model(cfg: JobConfig, key: str, name: str, *, sentence_transformers: bool) -> tuple[dict, Path] | None:
    """One configured model loads (see ``check_models``).

    Returns:
        (its transformer's ``config.json`` as a dict, that file's path), or None where it is not
        known before the model is downloaded (a hub id while the hub is on).

    Raises:
        ConfigError: naming the job file and ``key``.
    """
    from augsbert_ray.models import check_local_weights, embedded_model_dir, transformer_dir

    try:
        if name == EMBEDDED_MODEL:
            # the package is installed (each worker checks the weights' hash)
            return read_config(embedded_model_dir(verify=False))
        path = Path(name).expanduser()
        if path.is_dir():
            check_local_weights(path, sentence_transformers=sentence_transformers)
            return read_config(transformer_dir(path) if sentence_transformers else path)
        if looks_like_path(name):
            raise ModelError(f"no such model folder: {unresolved(cfg, key, name)} (a hub id looks like org/name)")
        check_hub_id(name)
        return cached_hub_model(name) if hub_offline() else None
    except AugSBERTError as e:
        raise ConfigError(cfg.source, key, str(e)) from None


def check_given_teacher(cfg: JobConfig, found: tuple[dict, Path] | None) -> None:
    """``cross_encoder.train: false`` labels with the model as it is: it must have a trained
    classification head of one output (as ``augsbert label`` reads one, ``models.check_cross_encoder``).

    Args:
        found: the model's ``config.json`` and its path (``check_model``); None: not known yet (a hub
            id while the hub is on), read through transformers, which fetches the config alone.

    Raises:
        ConfigError: naming ``cross_encoder.model``, the model's config and why it cannot label as given.
    """
    from augsbert_ray.models import check_cross_encoder

    name = cfg.cross_encoder.model
    why = "cross_encoder.train is false, so the teacher labels as given"
    try:
        if found is None:
            trained = check_cross_encoder(name)
            where = name
        else:
            config, path = found
            trained, where = head_outputs(config), str(path)
            if trained not in (None, 1):
                raise ModelError(f"{name}: a classifier with {trained} outputs ({where}); {why}, and labelling "
                                 "needs a cross-encoder that scores a pair with one output")
            trained = trained == 1
    except AugSBERTError as e:
        raise ConfigError(cfg.source, "cross_encoder.model", str(e)) from None
    if not trained:
        what = "the embedded MiniLM (a sentence embedding model)" if name == EMBEDDED_MODEL else name
        raise ConfigError(cfg.source, "cross_encoder.model",
                          f"{what} has no trained classification head (no *ForSequenceClassification architecture "
                          f"in {where}); {why}, and a new head's scores would mean nothing: give a trained "
                          "cross-encoder (a reranker's hub id or folder, or an earlier job's "
                          "runs/NAME/models/cross-encoder), or set cross_encoder.train: true")


def head_outputs(config: dict) -> int | None:
    """The outputs of a ``config.json``'s sequence-classification head; None where it has none."""
    if not any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        return None
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    n = config.get("num_labels")
    return n if isinstance(n, int) and not isinstance(n, bool) else 2  # transformers' default


def looks_like_path(name: str) -> bool:
    """A model name written as a path rather than a hub id (``org/name``)."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.strip("/").count("/") > 1 or name in (".", "..")


def check_hub_id(name: str) -> None:
    """A name that is not a local folder is a valid Hugging Face id (``org/name``, as the hub spells them).

    Raises:
        ModelError: why the hub would refuse it, and that no such folder exists either.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as e:
        raise ModelError(f"{name!r} is neither a model folder (none is there: {Path(name).absolute()}) nor a valid "
                         f"Hugging Face id: {e}") from None


def hub_offline() -> bool:
    """The Hugging Face hub is switched off for this process (as huggingface_hub reads it)."""
    return any(os.environ.get(var, "").strip().lower() in _TRUE for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cached_hub_model(name: str) -> tuple[dict, Path]:
    """A hub model's config from the local Hugging Face cache, its weights checked, while the
    hub is off.

    Raises:
        ModelError: the model is not in the cache (naming the cache and how to fill it), or its
            cached weights are damaged.
    """
    from huggingface_hub import constants, try_to_load_from_cache

    from augsbert_ray.weights import check_weights_file

    config = try_to_load_from_cache(name, "config.json")
    if not isinstance(config, str):
        raise ModelError(f"hub model {name!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) "
                         "and the hub is off (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set): download it where "
                         f"the hub is reachable (huggingface-cli download {name}), or give a local folder")
    for weights in ("model.safetensors", "pytorch_model.bin"):
        cached = try_to_load_from_cache(name, weights)
        if isinstance(cached, str):
            check_weights_file(Path(cached))
            break
    return read_config(Path(config).parent)


def read_config(folder: Path) -> tuple[dict, Path] | None:
    """A model folder's ``config.json`` (None where it has none to read: not a transformers model).

    Raises:
        ModelError: the file is not a JSON object.
    """
    from augsbert_ray.models import _config

    path = folder / "config.json"
    if not path.is_file():
        return None
    return _config(folder), path


def check_limits(cfg: JobConfig, encoder: str, config: dict, path: Path) -> None:
    """``<encoder>.max_length`` fits the model's positions; ``bi_encoder.num_layers`` its layers.

    Raises:
        ConfigError: naming the key, the model's ``config.json`` and the limit.
    """
    settings = getattr(cfg, encoder)
    too_long = length_problem(settings.max_length, config, path)
    if too_long:
        raise ConfigError(cfg.source, f"{encoder}.max_length", too_long)
    layers = config.get("num_hidden_layers")
    asked = getattr(settings, "num_layers", None)
    if asked is not None and isinstance(layers, int) and asked > layers:
        raise ConfigError(cfg.source, f"{encoder}.num_layers",
                          f"{asked} layers asked for, but the model has {layers} (num_hidden_layers in {path}): "
                          f"give at most {layers}, or null for all")


def length_problem(max_length: int, config: dict, path) -> str | None:
    """Why ``max_length`` tokens do not fit a model's positions (None: they do, or it is not known)."""
    positions = max_tokens(config)
    if positions is not None and max_length > positions:
        return (f"{max_length} tokens is more than the model's {positions} positions (max_position_embeddings in "
                f"{path}): give at most {positions}")
    return None


def check_label_length(name: str, max_length: int, key: str = "--max-length") -> None:
    """``augsbert label``'s token limit fits its cross-encoder's positions, as ``check_limits`` checks
    a job's: a longer pair would fail in every labelling actor, after Ray started. Call it after
    ``models.check_cross_encoder`` has found the model.

    Raises:
        ConfigError: naming ``key``, the model's ``config.json`` and the limit.
    """
    from augsbert_ray.models import embedded_model_dir

    if name == EMBEDDED_MODEL:
        found = read_config(embedded_model_dir(verify=False))
    elif Path(name).expanduser().is_dir():
        found = read_config(Path(name).expanduser())
    elif hub_offline():
        found = cached_hub_model(name)
    else:
        from transformers import AutoConfig

        from augsbert_ray.models import trust_remote_code

        try:  # from the hub's cache, where check_cross_encoder put it
            found = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code()).to_dict(), f"{name}'s config"
        except (OSError, ValueError):
            found = None
    too_long = length_problem(max_length, *found) if found is not None else None
    if too_long:
        raise ConfigError(key, None, too_long)


def max_tokens(config: dict) -> int | None:
    """The longest input, in tokens, that a model's position embeddings allow (None: unknown, or
    a model without absolute positions, as DeBERTa's ``position_biased_input: false``)."""
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int) or isinstance(positions, bool) or config.get("position_biased_input") is False:
        return None
    if config.get("model_type") in _POSITION_OFFSET_TYPES:
        pad = config.get("pad_token_id")
        positions -= (pad if isinstance(pad, int) else 1) + 1
    return positions
