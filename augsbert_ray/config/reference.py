"""The job settings' reference, generated from the config models: jobs/CONFIG.md.

Every field's default, type and ``description`` come from the code, so the reference cannot
drift from what ``augsbert validate`` accepts; a test fails when the file is not current.

    python -m augsbert_ray.config.reference            # rewrites jobs/CONFIG.md
    python -m augsbert_ray.config.reference --check    # exit status 1 when it is not current
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from augsbert_ray.config.explain import _text
from augsbert_ray.config.job import JobConfig

DEFAULT_OUT = Path("jobs") / "CONFIG.md"
REGENERATE = "python -m augsbert_ray.config.reference"

_HEADER = f"""\
# Job settings

Generated from the config models (`augsbert_ray/config/`) by `{REGENERATE}`: do not edit
by hand. `augsbert validate --explain JOB` prints the same descriptions beside one job's
values. Any key can be overridden on the command line: `augsbert run JOB key.sub=value`.
*placement* marks a setting that only places or sizes work: changing it never redoes a
finished stage.
"""


def reference() -> str:
    """The Markdown reference of every job setting: one section per config section, a row per
    setting (key, default, type, what it does), nested sections in the order they are declared."""
    out = [_HEADER]
    _section(JobConfig, "", out, seen={})
    return "\n".join(out).rstrip("\n") + "\n"


def _section(model: type[BaseModel], prefix: str, out: list[str], seen: dict[type, str]) -> None:
    seen[model] = prefix
    title = prefix or "top level"
    out.append(f"## {title}\n")
    if _summary(model):
        out.append(_summary(model) + "\n")
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        sub = _nested_model(field.annotation)
        if sub is not None:
            nested.append((key, sub))
            if sub not in seen:
                seen[sub] = key  # a section's keys are listed once, under the first key that holds it
                where = f"its keys: [{key}](#{_anchor(key)})"
            else:
                where = f"the keys of [{seen[sub]}](#{_anchor(seen[sub])})"
            rows.append((key, _default(field), _type(field.annotation), f"{_cell(field.description)} ({where})"))
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        meaning = _cell(field.description) + (" *placement*" if extra.get("placement") else "")
        rows.append((key, _default(field), _type(field.annotation), meaning))
    out.append("| key | default | type | what it does |\n|---|---|---|---|")
    out.extend(f"| `{k}` | {d} | {t} | {m} |" for k, d, t, m in rows)
    out.append("")
    for key, sub in nested:
        if seen.get(sub) == key:
            _section(sub, key, out, seen)


def _summary(model: type[BaseModel]) -> str:
    """A section's docstring up to its first blank line, as one Markdown paragraph."""
    doc = (model.__dict__.get("__doc__") or "").strip()
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "`")


def _anchor(key: str) -> str:
    """The anchor GitHub gives the heading ``## key``: dots dropped, lowercase."""
    return key.replace(".", "").lower()


def _nested_model(annotation) -> type[BaseModel] | None:
    """The section model a field holds (``X`` or ``X | None``), or None for a plain value."""
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return ""  # a section's defaults are its keys' own
    return f"`{_text(value)}`"


def _type(annotation) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " / ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_type(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (list, tuple, dict):
        inner = ", ".join(_type(a) for a in args if a is not Ellipsis)
        return f"{origin.__name__}[{inner}]" if inner else origin.__name__
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _cell(text: str | None) -> str:
    """A description as one Markdown table cell."""
    return " ".join((text or "").split()).replace("|", "\\|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the file to write (default: {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit status 1 when the file differs")
    args = parser.parse_args(argv)
    text = reference()
    current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
    if args.check:
        if current != text:
            print(f"{args.out} is not current: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if current != text:
        args.out.write_text(text, encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
