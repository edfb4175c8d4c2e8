"""The base of every config model: unknown keys refused, and booleans never taken for numbers.

YAML reads ``true``, ``yes`` and ``on`` as booleans, and pydantic would then turn a boolean into
1 (or 1.0) wherever a number is expected, so ``sampling.top_k: true`` would run with one
neighbour. A number written as text keeps working (``lr: 1e-4``, which YAML reads as a string).
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _leaves(annotation: Any) -> set[type]:
    """The types a field's annotation is built from (``int | list[float]`` -> int, float, list),
    stopping at config models, whose own fields are checked by their own validator."""
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return {BaseModel}
        out = {annotation}
    else:
        out = set()
    if annotation is Any:
        return {object}
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) or typing.get_args(arg) or arg is Any:
            out |= _leaves(arg)
    return out


def _numbers_only(annotation: Any) -> bool:
    """True where a boolean can only be a mistake: the field holds numbers and no booleans."""
    leaves = _leaves(annotation)
    return bool(leaves & {int, float}) and not leaves & {bool, object, BaseModel}


def _bool_at(value: Any, where: str = "") -> str | None:
    """Where the first boolean in ``value`` is ("" for ``value`` itself, ``.train`` or ``[1]``
    inside it), or None when it holds none."""
    if isinstance(value, bool):
        return where
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, (list, tuple)) else ())
    for k, v in items:
        found = _bool_at(v, f"{where}.{k}" if isinstance(value, dict) else f"{where}[{k}]")
        if found is not None:
            return found
    return None


class StrictModel(BaseModel):
    """A config model: extra keys are errors, and a boolean where a number belongs is refused."""

    # allow_inf_nan: a setting of inf or nan (a learning rate, a weight, a threshold) is never meant.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        where = _bool_at(value) if field is not None else None
        if where is not None and _numbers_only(field.annotation):
            what = (f"{str(value).lower()} is a boolean" if not where
                    else f"{info.field_name}{where} in {value!r} is a boolean")
            raise ValueError(f"{what} (YAML reads true/false, yes/no and on/off as booleans), where a number "
                             "is expected: give the number")
        return value
