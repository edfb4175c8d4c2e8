"""The column map of generic formats (csv, tsv, jsonl, parquet, hf): which column is what."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from augsbert_ray.errors import DataError
from augsbert_ray.loaders.rows import BadRow, RawRow, span_note
from augsbert_ray.sources import ColumnMap


def required_columns(columns: ColumnMap) -> list[str]:
    """Returns the source columns ``columns`` reads, without repeats."""
    wanted = [columns.sentence1, columns.sentence2, columns.label, columns.genre]
    return list(dict.fromkeys(c for c in wanted if c is not None))


def require_columns(
    path: str, present: Sequence[str], columns: ColumnMap, line: int | None
) -> None:
    """Checks a header (or a Parquet / hub schema) holds every mapped column.

    Raises:
        DataError: naming ``path``, ``line`` and the first missing column.
    """
    missing = [c for c in required_columns(columns) if c not in present]
    if missing:
        raise DataError(path, line, missing[0], f"column not found; columns are {list(present)}")


def map_record(line: int, record: Mapping[str, object], columns: ColumnMap,
               last_line: int | None = None) -> RawRow | BadRow:
    """Picks the mapped values out of one record (a CSV row, a JSON object, a Parquet row).

    ``last_line``: the record's last line, when it spans several (a quoted csv field with line breaks).
    """
    missing = [c for c in required_columns(columns) if c not in record]
    if missing:
        return BadRow(line, missing[0], f"missing (row has keys {sorted(record)})" + span_note(line, last_line))
    genre = record[columns.genre] if columns.genre is not None else None
    sentence1, sentence2 = record[columns.sentence1], record[columns.sentence2]
    label = record[columns.label] if columns.label is not None else None
    return RawRow(line, sentence1, sentence2, label, genre, last_line)
