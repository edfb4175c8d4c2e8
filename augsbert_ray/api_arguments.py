"""The Python API's arguments, checked before anything is read: a wrong type is one
``errors.ArgumentTypeError`` (an ``AugSBERTError`` and a ``TypeError``) naming the argument,
what it takes and what it got, not an ``AttributeError`` from deep inside.

A single string where a list of strings is taken (``load_job``'s overrides, ``label``'s pair
files, ``bench``'s parts) is one item, never its characters.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from augsbert_ray.errors import ArgumentTypeError

PATH = (str, os.PathLike)


def _got(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def require(function: str, name: str, value, kinds: tuple, what: str, optional: bool = False) -> None:
    """``value`` is one of ``kinds`` (or None, where ``optional``); booleans never pass for numbers.

    Raises:
        ArgumentTypeError: ``function``'s argument ``name`` takes ``what``.
    """
    if value is None and optional:
        return
    numeric = any(k in (int, float) for k in kinds) and bool not in kinds
    if not isinstance(value, kinds) or (numeric and isinstance(value, bool)):
        raise ArgumentTypeError(f"augsbert_ray.{function}: argument {name!r} takes {what}"
                                f"{' or None' if optional else ''}, got {_got(value)}")


def strings(function: str, name: str, value, what: str, kinds: tuple = (str,), optional: bool = False
            ) -> list | None:
    """A list of strings (or paths) from one or a sequence of them.

    Raises:
        ArgumentTypeError: not a string nor a sequence of them (naming the item that is not).
    """
    if value is None and optional:
        return None
    if isinstance(value, kinds):
        return [value]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, (Sequence, set, frozenset)):
        raise ArgumentTypeError(f"augsbert_ray.{function}: argument {name!r} takes {what}"
                                f"{' or None' if optional else ''}, got {_got(value)}")
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, kinds):
            raise ArgumentTypeError(f"augsbert_ray.{function}: argument {name!r} takes {what}; item {i} is "
                                    f"{_got(item)}")
    return items


def check_label(model, pairs, out, columns, format, score_column, max_length, precision, token_budget, num_gpus,
                actors, block_size, address, fresh, verbose) -> list:
    """``label``'s arguments; returns the pair files as a list."""
    f = "label"
    require(f, "model", model, PATH, "a model name or folder (str or path)")
    files = strings(f, "pairs", pairs, "a pair file, folder or glob, or a list of them (str or path)", PATH)
    if not files or any(not str(p).strip() for p in files):
        raise ArgumentTypeError(f"augsbert_ray.label: argument 'pairs' takes a pair file, folder or glob, or a list "
                                f"of them, got {_got(pairs)}")
    require(f, "out", out, PATH, "a folder (str or path)")
    require(f, "columns", columns, (str, dict), "'sentence1=NAME,sentence2=NAME' or a dict", optional=True)
    if isinstance(columns, dict):
        for key, column in columns.items():
            if not isinstance(key, str) or not isinstance(column, str):
                raise ArgumentTypeError(f"augsbert_ray.label: argument 'columns' maps field names to column names "
                                        f"(str to str), got {_got(key)}: {_got(column)}")
    require(f, "format", format, (str,), "a format name (str)", optional=True)
    require(f, "score_column", score_column, (str,), "a column name (str)")
    require(f, "max_length", max_length, (int,), "a number of tokens (int)")
    require(f, "precision", precision, (str,), "a precision name (str)")
    require(f, "token_budget", token_budget, (int,), "a number of tokens (int)")
    require(f, "num_gpus", num_gpus, (int, float), "a number of GPUs per actor (int or float)")
    require(f, "actors", actors, (int,), "a number of actors (int)", optional=True)
    require(f, "block_size", block_size, (int,), "a number of pairs (int)")
    require(f, "address", address, (str,), "a Ray address (str)", optional=True)
    require(f, "fresh", fresh, (bool,), "True or False")
    require(f, "verbose", verbose, (bool,), "True or False")
    return files


def check_run(job, fresh, verbose, address, until) -> None:
    from augsbert_ray.cluster_address import AddressChoice
    from augsbert_ray.config import JobConfig

    f = "run"
    require(f, "job", job, (JobConfig, *PATH), "a JobConfig (augsbert_ray.load_job) or a job file's path")
    require(f, "fresh", fresh, (bool,), "True or False")
    require(f, "verbose", verbose, (bool,), "True or False")
    require(f, "address", address, (str, AddressChoice), "a Ray address (str)", optional=True)
    require(f, "until", until, (str,), "a stage name (str)", optional=True)


def check_bench(out, quick, model, parts, address, data_dir, verbose, log, command) -> list | None:
    """``bench``'s arguments; returns the parts as a list (None: all)."""
    f = "bench"
    require(f, "out", out, PATH, "a folder (str or path)")
    require(f, "quick", quick, (bool,), "True or False")
    require(f, "model", model, (str,), "a model name or folder (str)")
    listed = strings(f, "parts", parts, "a part name or a list of them (str)", optional=True)
    require(f, "address", address, (str,), "a Ray address (str)", optional=True)
    require(f, "data_dir", data_dir, PATH, "a folder (str or path)", optional=True)
    require(f, "verbose", verbose, (bool,), "True or False")
    if log is not None and not callable(log):
        raise ArgumentTypeError(f"augsbert_ray.bench: argument 'log' takes a function of one line, or None, got "
                                f"{_got(log)}")
    require(f, "command", command, (str,), "a string", optional=True)
    return listed
