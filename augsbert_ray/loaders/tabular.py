"""Generic files of sentence pairs: csv, tsv, jsonl and parquet, read through ``columns``.

Unlike the original STSb / MRPC files, these follow the standard conventions of their
format (csv quoting, one JSON object per line), and every one names its columns: a header
row, JSON keys or the Parquet schema.

A quoted csv/tsv field may hold line breaks, so one record can span several lines, and a
quote left open swallows every line up to the next quote. Loading never loses lines
without saying so:

- a quoted field still open at the end of the file is an error in both ``on_bad_rows``
  modes (everything after the quote would be lost), naming the line where the record
  starts and how many lines it swallowed;
- a record spanning more than ``MAX_RECORD_LINES`` lines is an error in both modes too: a
  sentence with that many line breaks is far more likely a quote left open and closed by
  another stray quote further down than real text;
- a bad record that spans several lines names its span ("lines 6-9") in its reason, so a
  skipped record lists every line it took with it.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from augsbert_ray.errors import DataError
from augsbert_ray.loaders.lines import read_lines
from augsbert_ray.loaders.mapping import map_record, require_columns, required_columns
from augsbert_ray.loaders.rows import BadRow, RawRow, span_note
from augsbert_ray.sources import DataSource

# The most physical lines one csv/tsv record may span (a quoted field holding line breaks).
MAX_RECORD_LINES = 10


def read_csv(source: DataSource) -> Iterator[RawRow | BadRow]:
    """Comma-separated, standard quoting, header row first."""
    return _read_delimited(source, ",", "csv")


def read_tsv(source: DataSource) -> Iterator[RawRow | BadRow]:
    """Tab-separated, standard quoting, header row first."""
    return _read_delimited(source, "\t", "tsv")


def _read_delimited(source: DataSource, delimiter: str, kind: str) -> Iterator[RawRow | BadRow]:
    path = source.path
    undecodable: dict[int, str] = {}  # line number -> reason, filled as the csv reader pulls lines

    def texts() -> Iterator[str]:
        for line in read_lines(path):
            if line.error:
                undecodable[line.number] = line.error
            yield line.text + "\n"

    # strict: a stray quote is an error, not a field that silently swallows later lines.
    reader = csv.reader(texts(), delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
    except csv.Error as e:
        raise DataError(path, 1, None, f"malformed header: {e}") from None
    if header is None:
        raise DataError(path, None, None, "empty file: a header row is needed")
    if undecodable:
        raise DataError(path, 1, None, f"header: {next(iter(undecodable.values()))}")
    require_columns(path, header, source.columns, line=1)
    start = reader.line_num + 1  # a quoted field may span lines: a row starts where the last ended
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            last = reader.line_num
            if "unexpected end of data" in str(e):  # strict mode: the file ended inside a quoted field
                swallowed = f", swallowing lines {start + 1}-{last} ({last - start} lines)" if last > start else ""
                raise DataError(path, start, None, f"unterminated quote: this record runs to the end of the file"
                                f"{swallowed}; close the quote (a quote inside a quoted field is written "
                                "twice)") from None
            yield BadRow(start, None, f"malformed {kind}: {e}{span_note(start, last)}")
            start = last + 1
            continue
        first, start = start, reader.line_num + 1
        last = start - 1
        if last - first + 1 > MAX_RECORD_LINES:
            raise DataError(path, first, None, f"one record spans lines {first}-{last} ({last - first + 1} lines, more "
                            f"than the {MAX_RECORD_LINES} a record may span): a quote left open? Its line breaks are "
                            "inside a quoted field; close the quote, or write the field's line breaks as spaces")
        error = next((undecodable[n] for n in range(first, start) if n in undecodable), None)
        if error:
            yield BadRow(first, None, error + span_note(first, last))
        elif not fields:  # a blank line is not a row
            continue
        elif len(fields) < len(header):
            reason = f"missing (row has {len(fields)} fields, header has {len(header)})"
            yield BadRow(first, header[len(fields)], reason + span_note(first, last))
        elif len(fields) > len(header):
            reason = f"extra field (row has {len(fields)} fields, header has {len(header)})"
            yield BadRow(first, None, reason + span_note(first, last))
        else:
            yield map_record(first, dict(zip(header, fields)), source.columns, last_line=last)


def read_jsonl(source: DataSource) -> Iterator[RawRow | BadRow]:
    """One JSON object per line; blank lines are not rows, any other non-object is a bad row."""
    for line in read_lines(source.path):
        if line.error:
            yield BadRow(line.number, None, line.error)
            continue
        if not line.text.strip():
            continue
        try:
            record = json.loads(line.text)
        except json.JSONDecodeError as e:
            yield BadRow(line.number, None, f"invalid JSON: {e.msg} (column {e.colno})")
            continue
        except (ValueError, RecursionError) as e:  # an integer of > 4300 digits; deep nesting
            yield BadRow(line.number, None, f"invalid JSON: {e}")
            continue
        if not isinstance(record, dict):
            yield BadRow(line.number, None, f"not a JSON object: {type(record).__name__}")
            continue
        yield map_record(line.number, record, source.columns)


def read_parquet(source: DataSource) -> Iterator[RawRow | BadRow]:
    """A Parquet file; a row's ``line`` is its index + 1. A missing column has no line."""
    try:
        table = pq.read_table(source.path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(source.path, None, None, f"cannot read Parquet: {e}") from None
    require_columns(source.path, table.column_names, source.columns, line=None)
    table = table.select(required_columns(source.columns))
    try:
        records = table.to_pylist()
    except (ValueError, OverflowError, pa.ArrowException):
        records = None  # a value Python cannot hold (a timestamp past year 9999): go row by row
    for number in range(1, table.num_rows + 1):
        record = records[number - 1] if records is not None else _parquet_row(table, number)
        yield record if isinstance(record, BadRow) else map_record(number, record, source.columns)


def _parquet_row(table: pa.Table, number: int) -> dict[str, object] | BadRow:
    record = {}
    for name in table.column_names:
        try:
            record[name] = table.column(name)[number - 1].as_py()
        except (ValueError, OverflowError, pa.ArrowException) as e:
            return BadRow(number, name, f"value cannot be read: {e}")
    return record
