"""Row checks shared by every reader: labels, sentences, bad-row policy, the Arrow table.

Readers only find the raw values of each row (or say why they cannot); everything that
decides whether a row is good lives here, so every format enforces the same rules.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.errors import DataError


@dataclass(frozen=True)
class SkippedRow:
    """A bad row left out under ``on_bad_rows="skip"``; same fields as :class:`DataError`."""

    path: str
    line: int
    field: str | None
    reason: str


@dataclass
class LoadResult:
    """What a loader returns.

    Attributes:
        table: the good rows, ``PAIR_SCHEMA``, in file order.
        rows_read: data rows seen, good or bad (headers and blank lines are not rows).
        skipped: the bad rows, in file order.
        filtered: good rows left out because their genre is not among the source's
            ``genres``; ``rows_read == table.num_rows + len(skipped) + filtered``.
    """

    table: pa.Table
    rows_read: int
    skipped: list[SkippedRow]
    filtered: int = 0


@dataclass(frozen=True)
class RawRow:
    """A row's values as a reader found them, not yet checked.

    ``last_line`` is the row's last physical line when it spans several (a quoted csv field
    holding line breaks); a bad row's reason then names the whole span.
    """

    line: int
    sentence1: object
    sentence2: object
    label: object
    genre: object = None
    last_line: int | None = None


def span_note(first: int, last: int | None) -> str:
    """What the reason of a bad row spanning several lines adds: the lines it took."""
    return f" (one record of lines {first}-{last})" if last is not None and last > first else ""


@dataclass(frozen=True)
class BadRow:
    """A row a reader could not even split into values (too few fields, bad bytes, ...)."""

    line: int
    field: str | None
    reason: str


class _Invalid(Exception):
    def __init__(self, field: str | None, reason: str):
        self.field, self.reason = field, reason


def collect(
    records: Iterable[RawRow | BadRow],
    *,
    path: str,
    split: str,
    label_range: tuple[float, float],
    binary: bool,
    on_bad_rows: Literal["error", "skip"],
    labelled: bool = True,
) -> LoadResult:
    """Checks every row and builds the pair table.

    Args:
        records: a reader's rows, in file order.
        path: written to the ``source`` column and to errors.
        split: written to the ``split`` column.
        label_range: raw ``(lo, hi)``; labels are scaled to ``(x - lo) / (hi - lo)``.
        binary: the scaled label must be exactly 0 or 1.
        on_bad_rows: ``"error"`` raises at the first bad row, ``"skip"`` records it.
        labelled: rows carry labels; False (unlabelled pairs) gives every row a NaN label.

    Returns:
        the table of good rows, the number of rows read, and the skipped rows.

    Raises:
        DataError: at the first bad row when ``on_bad_rows="error"``.
        ValueError: ``on_bad_rows`` is neither ``"error"`` nor ``"skip"``.
    """
    if on_bad_rows not in ("error", "skip"):
        raise ValueError(f"on_bad_rows must be 'error' or 'skip', got {on_bad_rows!r}")
    columns: dict[str, list] = {name: [] for name in schema.PAIR_SCHEMA.names}
    skipped: list[SkippedRow] = []
    rows_read = 0
    for record in records:
        rows_read += 1
        try:
            if isinstance(record, BadRow):
                raise _Invalid(record.field, record.reason)
            s1 = _sentence(record.sentence1, schema.SENTENCE1)
            s2 = _sentence(record.sentence2, schema.SENTENCE2)
            label = _label(record.label, label_range, binary) if labelled else math.nan
            genre = None if record.genre is None else _unicode(str(record.genre), schema.GENRE)
        except _Invalid as bad:
            reason = bad.reason + span_note(record.line, getattr(record, "last_line", None))
            if on_bad_rows == "error":
                raise DataError(path, record.line, bad.field, reason) from None
            skipped.append(SkippedRow(path, record.line, bad.field, reason))
            continue
        values = (s1, s2, label, split, path, record.line, genre)  # PAIR_SCHEMA's order
        for name, value in zip(schema.PAIR_SCHEMA.names, values):
            columns[name].append(value)
    return LoadResult(pa.table(columns, schema=schema.PAIR_SCHEMA), rows_read, skipped)


def _sentence(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(field, f"not a string: {value!r}")
    text = value.strip()
    if not text:
        raise _Invalid(field, "empty sentence")
    return _unicode(text, field)


def _unicode(text: str, field: str) -> str:
    # JSON's \ud800-style escapes decode to lone surrogates, which Arrow cannot store.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        reason = f"lone surrogate U+{ord(text[e.start]):04X} (a bad \\u escape?)"
        raise _Invalid(field, reason) from None
    return text


def _label(value: object, label_range: tuple[float, float], binary: bool) -> float:
    # bool is a Real in Python; True as a similarity score is more likely a mapping mistake.
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise _Invalid(schema.LABEL, f"not a number: {value!r}")
    try:
        x = float(value)
    except ValueError:
        raise _Invalid(schema.LABEL, f"not a number: {value!r}") from None
    except OverflowError:  # an integer too large for a float, e.g. a 400-digit JSON number
        raise _Invalid(schema.LABEL, f"out of range: a {len(str(value))}-digit integer") from None
    if not math.isfinite(x):
        raise _Invalid(schema.LABEL, f"not a finite number: {value!r}")
    lo, hi = label_range
    if not lo <= x <= hi:
        raise _Invalid(schema.LABEL, f"out of range [{lo:g}, {hi:g}]: {x:g}")
    scaled = (x - lo) / (hi - lo)
    if binary and scaled not in (0.0, 1.0):
        raise _Invalid(schema.LABEL, f"not binary: {x:g} scales to {scaled:g}, needs 0 or 1")
    return scaled
