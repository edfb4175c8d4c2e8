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


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_bool(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_bool(v) for v in value.values())
    return False


class StrictModel(BaseModel):
    """A config model: extra keys are errors, and a boolean where a number belongs is refused."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _holds_bool(value) and _numbers_only(field.annotation):
            what = (f"{str(value).lower()} is a boolean" if isinstance(value, bool)
                    else f"{value!r} holds a boolean")
            raise ValueError(f"{what} (YAML reads true/false, yes/no and on/off as booleans), where a number "
                             "is expected: give the number")
        return value
