"""``augsbert validate --explain``: every setting of a job with its value, default and meaning."""

from __future__ import annotations

import json
import textwrap

from pydantic import BaseModel
from pydantic_core import PydanticUndefined, to_jsonable_python

from augsbert_ray.config.job import JobConfig


def explain(cfg: JobConfig, width: int = 100) -> str:
    """The job's settings, section by section: each field's value in this job, its default
    and its description (from the field's ``description``).

    Args:
        cfg: a validated job config.
        width: where descriptions wrap.

    Returns:
        Text with one ``[section]`` heading per config section (``[job]`` for the top-level
        keys), then ``key: value  (default: ...)`` and the indented description per field;
        ``[placement]`` marks settings that never change a result.
    """
    lines: list[str] = []
    _section(cfg, "", lines, width)
    return "\n".join(lines) + "\n"


def _section(model: BaseModel, prefix: str, lines: list[str], width: int) -> None:
    fields = type(model).model_fields
    nested = [name for name in fields if isinstance(getattr(model, name), BaseModel)]
    lines.append(f"[{prefix or 'job'}]" + (f"  {_doc(type(model))}" if _doc(type(model)) else ""))
    for name, field in fields.items():
        if name in nested:
            continue
        value = _text(getattr(model, name))
        default = field.get_default(call_default_factory=True)
        default = "required" if default is PydanticUndefined else _text(default)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        tag = "  [placement]" if extra.get("placement") else ""
        lines.append(f"{prefix}{'.' if prefix else ''}{name}: {value}  (default: {default}){tag}")
        if field.description:
            lines.extend(textwrap.wrap(field.description, width, initial_indent="    ", subsequent_indent="    "))
    for name in nested:
        lines.append("")
        _section(getattr(model, name), f"{prefix}.{name}" if prefix else name, lines, width)


def _doc(cls: type) -> str:
    """The first line of a section's docstring (pydantic's own base has none of interest)."""
    doc = cls.__dict__.get("__doc__") or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _text(value) -> str:
    return json.dumps(to_jsonable_python(value))
