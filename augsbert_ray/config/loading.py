"""The YAML front end of the job config: reading, overrides, validation, and the dump.

A job file is validated completely before anything is built or started, and every
error names the file and the dotted key that is wrong::

    jobs/stsb.yaml: key 'bi_encoder.epochs' Input should be greater than 0

A key given twice in one mapping (two ``sampling:`` sections) is an error, not a silent
"the last one wins"; an unknown key is named with the closest valid key and every valid
key at its level.
"""

from __future__ import annotations

import collections
import difflib
import os
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from augsbert_ray.config.env import EnvReference, expand_env
from augsbert_ray.config.job import JobConfig
from augsbert_ray.errors import ConfigError

_MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_duplicate_keys(root: yaml.Node | None, path: str | None) -> None:
    """Raises on a key given twice in one mapping, which PyYAML would silently resolve to the last.

    Hand-written: PyYAML has no option for it, and ruamel.yaml's DuplicateKeyError (another
    YAML stack to depend on) does not name the dotted key that this message must name.
    Walks the composed node graph (not the built tree, where the first value is already
    gone). Aliases can make the graph cyclic (``&a [*a]``), so each node is visited once.
    Merge keys (``<<: *base``) may be overridden by explicit keys, as YAML intends.

    Raises:
        ConfigError: naming the dotted key and both lines.
    """
    queue, seen = collections.deque([(root, "")]), set()
    while queue:
        node, key = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for k, v in node.value:
                if not isinstance(k, yaml.ScalarNode) or k.tag == _MERGE_TAG:
                    queue.append((v, key))
                    continue
                dotted = f"{key}.{k.value}" if key else k.value
                line = k.start_mark.line + 1
                if (k.tag, k.value) in first:
                    raise ConfigError(path, dotted, f"given twice in one mapping (lines {first[(k.tag, k.value)]} "
                                                    f"and {line}); YAML would silently keep only the last: "
                                                    "merge the two into one")
                first[(k.tag, k.value)] = line
                queue.append((v, dotted))
        elif isinstance(node, yaml.SequenceNode):
            queue.extend((v, f"{key}[{i}]") for i, v in enumerate(node.value))


# PyYAML lets some malformed input escape as plain Python errors: an impossible date
# (2020-13-45) or a bad value under an explicit tag (!!int x, !!bool maybe, !!timestamp x)
# raises ValueError, KeyError or AttributeError, and very deep nesting RecursionError.
_YAML_ERRORS = (yaml.YAMLError, ValueError, LookupError, AttributeError, RecursionError)


def _yaml_problem(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark else ""
    return f"invalid YAML{where}: {getattr(e, 'problem', None) or e}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parses ``key.sub=value`` into (["key", "sub"], value), the value read as YAML.

    Raises:
        ConfigError: if the text has no ``=``, an empty key, or a value that is not YAML.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(None, text, "an override must look like key.sub=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except _YAML_ERRORS as e:
        raise ConfigError(None, key.strip(), _yaml_problem(e)) from e
    return key.strip().split("."), value


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    """Sets each ``key.sub=value`` in a parsed YAML tree, creating mappings as needed."""
    for text in overrides:
        keys, value = parse_override(text)
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(None, ".".join(keys), f"'{k}' is not a mapping")
        node[keys[-1]] = value
    return tree


def load_job(path: str | os.PathLike, overrides: list[str] | None = None) -> JobConfig:
    """Loads, expands and validates a job file.

    Args:
        path: the YAML job file.
        overrides: ``key.sub=value`` strings applied on top of the file.

    Returns:
        The validated job config.

    Raises:
        ConfigError: on unreadable YAML, unknown or invalid keys; the message names the
            file and the dotted key.
    """
    path = str(path)
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise ConfigError(path, None, f"cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(path, None, f"not UTF-8 text: {e.reason} at byte {e.start}") from e
    try:
        _refuse_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), path)
        tree = yaml.safe_load(text)
    except _YAML_ERRORS as e:
        raise ConfigError(path, None, _yaml_problem(e)) from e
    if not isinstance(tree, dict):
        raise ConfigError(path, None, "a job file must be a YAML mapping")
    try:
        tree = apply_overrides(tree, overrides or [])
    except ConfigError as e:
        raise ConfigError(path, e.key, e.reason) from e
    refs: dict[str, list[EnvReference]] = {}
    try:
        tree = expand_env(tree, path, refs=refs)
    except RecursionError:  # a YAML alias inside itself (&a [*a]) makes an endless tree
        raise ConfigError(path, None, "a value contains itself (a recursive YAML alias?)") from None
    cfg = validate_tree(tree, path)
    cfg._source, cfg._env_refs = path, refs
    return cfg


def validate_tree(tree: dict, path: str | None = None) -> JobConfig:
    """Validates a parsed config tree, turning pydantic's errors into a ConfigError.

    Raises:
        ConfigError: naming ``path`` and the dotted key of the first problem; an unknown key
            comes with the closest valid key (if one is close) and every valid key at its level.
    """
    try:
        return JobConfig.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or None
        more = f" (and {e.error_count() - 1} more errors)" if e.error_count() > 1 else ""
        # pydantic prefixes the message of a validator's ValueError with "Value error, ".
        reason = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            reason = unknown_key_reason(err["loc"])
        elif err["type"] in ("literal_error", "enum"):
            reason += f", not {err['input']!r}"
        raise ConfigError(path, key, f"{reason}{more}") from e


def unknown_key_reason(loc: tuple) -> str:
    """Why ``loc`` is refused: the closest valid key, if one is close, and every valid key at its level.

    Example: ``unknown key; did you mean 'epochs'? (valid keys under bi_encoder: batch_size, ...)``.

    The valid keys are the fields of the config model at ``loc[:-1]``; where that level is
    not a model (a mapping of free keys), only "unknown key" is said.
    """
    model: Any = JobConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return "unknown key"
    valid = sorted(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    level = f" under {'.'.join(str(p) for p in loc[:-1])}" if len(loc) > 1 else ""
    return f"unknown key{hint} (valid keys{level}: {', '.join(valid)})"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model an annotation holds (``X``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if (model := _model_in(arg)) is not None:
                return model
    return None


def dump_job(cfg: JobConfig) -> str:
    """The resolved config as YAML, written into every run directory."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
