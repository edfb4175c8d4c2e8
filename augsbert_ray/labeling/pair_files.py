"""Pair files for ``augsbert label``: found, checked and read in shards, without Ray.

Inputs are files, directories (every file under them, hidden ones aside) or globs, on local
disk or at a storage URI (``s3://...``: whatever ``pyarrow.fs`` opens), each Parquet, JSON
lines, CSV or TSV (by extension, or one ``format`` for all). A column map names the columns
that hold the two sentences (``sentence1=question,sentence2=answer``); every other column
is carried to the output as it is (CSV and TSV values as text: nothing is guessed).

Every file is checked before Ray starts, with the gold loaders' own rules and messages
(``loaders.load_pairs``: a missing column, a malformed record, a value that is not a
string, an empty sentence, each named by file, line and field); Parquet files are checked
a column at a time, since they can be large and their types are known. A text file at a
storage URI is copied to a local folder first, so that it is read the same way. What the
output table could not hold is refused there too: a compressed file, a header naming a
column twice, a JSON lines column whose values are of types that do not go together (named
by line), files whose columns differ (each output row has every column, so one file's
columns would be null in another's rows), and inputs that hold no pairs at all.

The shards the labelling pipeline takes are candidate tables (``schema.CANDIDATE_SCHEMA``):
``id1`` is the file's index among the inputs, ``id2`` the row's index in its file, so a
shard's pairs come back from the actors in input order.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema
from augsbert_ray.errors import ConfigError, DataError
from augsbert_ray.sources import ColumnMap

FORMATS = ("parquet", "jsonl", "csv", "tsv")
EXTENSIONS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
              ".csv": "csv", ".tsv": "tsv"}
READ_ROWS = 65_536  # rows per batch read from a Parquet or CSV file
ORIGIN = "label"  # the candidate tables' origin column


@dataclass(frozen=True)
class PairFile:
    """One input file: where it is, how it is read, and what identifies its contents."""

    path: str  # as found (a local path or a URI)
    format: str
    size: int
    mtime_ns: int | None
    local: str | None = None  # a local copy of a remote text file, read in its place

    @property
    def readable(self) -> str:
        return self.local or self.path


@dataclass
class PairInputs:
    """Checked inputs: the files, the sentence columns, and the output's schema (every input
    column, then the score)."""

    files: list[PairFile]
    columns: ColumnMap
    rows: list[int]  # data rows per file
    schema: pa.Schema
    score_column: str
    staging: str | None = None  # a folder of local copies of remote files, removed by ``close``
    _jsonl_schemas: dict = field(default_factory=dict)

    @property
    def pairs(self) -> int:
        return sum(self.rows)

    def close(self) -> None:
        if self.staging:
            shutil.rmtree(self.staging, ignore_errors=True)


def parse_columns(text: str | dict | None) -> ColumnMap:
    """The sentence columns from ``sentence1=NAME,sentence2=NAME`` (or a dict); unnamed ones keep
    their default names (``sentence1``, ``sentence2``).

    Raises:
        ConfigError: a field other than sentence1 / sentence2, or an item without ``=``.
    """
    if text is None:
        pairs = {}
    elif isinstance(text, dict):
        pairs = dict(text)
    else:
        pairs = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise ConfigError("--columns", None, f"{item!r} is not FIELD=COLUMN (e.g. sentence1=question)")
            pairs[key.strip()] = value.strip()
    unknown = sorted(set(pairs) - {schema.SENTENCE1, schema.SENTENCE2})
    if unknown:
        raise ConfigError("--columns", None, f"unknown field {unknown[0]!r}; the fields are sentence1, sentence2")
    return ColumnMap(label=None, **pairs)


COMPRESSED = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zip": "zip"}


def find_pair_files(patterns: list[str], fmt: str | None = None, exclude: str | os.PathLike | None = None
                    ) -> list[PairFile]:
    """The files that ``patterns`` name (files, directories or globs, local or URIs), in the
    order given (a pattern's matches sorted by path), each once.

    Args:
        exclude: a local folder whose files are never inputs (the output folder: inside an
            input folder, its parts would otherwise be read as inputs by the next run).

    Raises:
        DataError: a pattern that matches nothing, or a file whose format is unknown.
        ConfigError: an unknown ``fmt``; ``exclude`` is an input folder or holds one.
    """
    from augsbert_ray.loaders.corpus import list_files

    if fmt is not None and fmt not in FORMATS:
        raise ConfigError("--format", None, f"unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    if not patterns:
        raise DataError("<pairs>", None, None, "no pair files given")
    skip = os.path.realpath(os.path.expanduser(str(exclude))) if exclude is not None else None
    found: dict[str, PairFile] = {}
    for pattern in map(str, patterns):
        if "://" not in pattern:  # absolute, so that a re-run from another folder finds the same files
            pattern = os.path.abspath(os.path.expanduser(pattern))
            if skip is not None and os.path.isdir(pattern) and _within(os.path.realpath(pattern), skip):
                raise ConfigError("--out", None, f"{exclude} is the input folder {pattern} or holds it: its scored "
                                                 "parts would be read as inputs; name a folder outside the inputs "
                                                 "(or one inside an input folder)")
        try:
            matches = list_files(pattern)
        except DataError:
            raise DataError(pattern, None, None, "no pair files found there (a file, a directory or a glob)") from None
        except (OSError, pa.ArrowException) as e:
            raise DataError(pattern, None, None, f"cannot list: {e}") from None
        for path, size, mtime in matches:
            if skip is not None and "://" not in path and _within(os.path.realpath(path), skip):
                continue
            stem, ext = os.path.splitext(path.lower())
            kind = fmt or EXTENSIONS.get(ext)
            if kind is None and ext in COMPRESSED:
                raise DataError(path, None, None, f"a {COMPRESSED[ext]}-compressed file: decompress it first and give "
                                                  f"the decompressed file (pair files are read as they are)")
            if kind is None:
                raise DataError(path, None, None, "unknown pair file format (by its extension); name it with "
                                                  f"--format ({', '.join(FORMATS)})")
            found.setdefault(path, PairFile(path, kind, size, mtime))
    if not found:
        raise DataError(str(patterns[0]) if len(patterns) == 1 else "<pairs>", None, None,
                        "no pair files found there besides the output folder")
    return list(found.values())


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_inputs(files: list[PairFile], columns: ColumnMap, score_column: str = "score") -> PairInputs:
    """Checks every file as the labelling will read it; copies remote text files to a local
    folder first (``PairInputs.close`` removes it).

    Returns:
        The checked inputs, with each file's row count and the output's schema.

    Raises:
        DataError: the first bad file or row, named by file, line (or row) and field; a
            file that already has the score column; a compressed file; a column named twice;
            files whose columns differ or cannot share one table; no pairs in any file.
    """
    staging = None
    checked, rows, schemas = [], [], []
    inputs = PairInputs([], columns, [], pa.schema([]), score_column)
    try:
        for f in files:
            if f.format != "parquet" and "://" in f.path:
                if staging is None:
                    import tempfile

                    staging = inputs.staging = tempfile.mkdtemp(prefix="augsbert-label-")
                f = PairFile(f.path, f.format, f.size, f.mtime_ns, _copy_local(f.path, staging, len(checked)))
            packed = _compression(f)
            if packed is not None:
                raise DataError(f.path, None, None, f"is {packed}-compressed, not {f.format}: decompress it first and "
                                                    "give the decompressed file")
            n, file_schema = _check_file(f, columns)
            if checked:
                _same_columns(checked[0], schemas[0][1], f, file_schema)
            if score_column in file_schema.names:
                raise DataError(f.path, None if f.format in ("parquet", "jsonl") else 1, score_column,
                                "the input already has this column; name the score column otherwise (--score-column)")
            if f.format == "jsonl":
                inputs._jsonl_schemas[f.path] = file_schema
            checked.append(f)
            rows.append(n)
            schemas.append((f, file_schema))
        if files and not sum(rows):
            if len(files) == 1:
                raise DataError(files[0].path, None, None, "no pairs to score: the file holds no rows (a header at most)")
            named = ", ".join(f.path for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
            raise DataError("<pairs>", None, None, f"no pairs to score: none of {named} holds a row (a header at most)")
        inputs.files, inputs.rows = checked, rows
        inputs.schema = _output_schema(schemas, columns, score_column)
    except BaseException:
        inputs.close()
        raise
    return inputs


def _compression(f: PairFile) -> str | None:
    """The compression a local file's first bytes show (``preflight.compression``), or None."""
    if "://" in f.readable:
        return None
    from augsbert_ray.preflight import compression

    return compression(Path(f.readable))


def _same_columns(first: PairFile, first_schema: pa.Schema, f: PairFile, file_schema: pa.Schema) -> None:
    """Files labelled together have the same columns (in any order)."""
    lacks = [n for n in first_schema.names if n not in file_schema.names]
    extra = [n for n in file_schema.names if n not in first_schema.names]
    if lacks or extra:
        what = "; ".join(part for part in (f"it has {', '.join(extra)}" if extra else "",
                                           f"it lacks {', '.join(lacks)}" if lacks else "") if part)
        raise DataError(f.path, None, None, f"its columns differ from those of {first.path} ({what}): each output row "
                                            "has every column, so label files of one layout together (another "
                                            "--out for each layout)")


def _copy_local(uri: str, folder: str, index: int) -> str:
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri)
    target = Path(folder) / f"{index:06d}-{os.path.basename(path)}"
    try:
        with fs.open_input_stream(path) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
    except (OSError, pa.ArrowException) as e:
        raise DataError(uri, None, None, f"cannot read: {e}") from None
    return str(target)


def _check_file(f: PairFile, columns: ColumnMap) -> tuple[int, pa.Schema]:
    """A file's data rows and its schema, after its checks (see the module docstring)."""
    if f.format == "parquet":
        return _check_parquet(f, columns)
    from augsbert_ray.loaders import load_pairs
    from augsbert_ray.sources import DataSource

    # The gold loaders' reader and row rules, on the two sentence columns (no label).
    result = load_pairs(DataSource(format=f.format, path=f.readable, columns=columns), "label")
    if f.format == "jsonl":
        file_schema = _jsonl_schema(f)
    else:
        header = _csv_header(f)
        _unique_names(f, header, line=1)
        file_schema = pa.schema([(name, pa.string()) for name in header])
    return result.rows_read, file_schema


def _unique_names(f: PairFile, names: list[str], line: int | None) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise DataError(f.path, line, name, "this column name is given twice: every column of the output needs "
                                                "a name of its own")
        seen.add(name)


def _check_parquet(f: PairFile, columns: ColumnMap) -> tuple[int, pa.Schema]:
    from augsbert_ray.loaders.mapping import require_columns, required_columns

    try:
        pf = _parquet(f)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f.path, None, None, f"cannot read Parquet: {e}") from None
    file_schema = pf.schema_arrow
    _unique_names(f, file_schema.names, line=None)
    require_columns(f.path, file_schema.names, columns, line=None)
    first = 1
    for batch in pf.iter_batches(batch_size=READ_ROWS, columns=required_columns(columns)):
        for name in (columns.sentence1, columns.sentence2):
            bad = _bad_sentence(batch.column(name))
            if bad is not None:
                row, reason = bad
                field_name = schema.SENTENCE1 if name == columns.sentence1 else schema.SENTENCE2
                raise DataError(f.path, first + row, field_name, reason)
        first += batch.num_rows
    return pf.metadata.num_rows, file_schema


def _bad_sentence(col: pa.Array) -> tuple[int, str] | None:
    """The first row of a column that is not a non-empty string, and why (the loaders' wording)."""
    if len(col) == 0:
        return None
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return 0, f"not a string: {col[0].as_py()!r} (a column of {col.type})"
    nulls = col.is_null()
    if pc.any(nulls).as_py():
        return int(np.flatnonzero(nulls.to_numpy(zero_copy_only=False))[0]), "not a string: None"
    empty = pc.equal(pc.utf8_trim_whitespace(col), "")
    if pc.any(empty).as_py():
        return int(np.flatnonzero(empty.to_numpy(zero_copy_only=False))[0]), "empty sentence"
    return None


def _parquet(f: PairFile):
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    if "://" in f.readable:
        fs, path = pafs.FileSystem.from_uri(f.readable)
        return pq.ParquetFile(fs.open_input_file(path))
    return pq.ParquetFile(f.readable)


def _csv_header(f: PairFile) -> list[str]:
    import csv

    with open(f.readable, encoding="utf-8-sig", newline="") as stream:
        return next(csv.reader(stream, delimiter="\t" if f.format == "tsv" else ","))


def _jsonl_records(f: PairFile) -> Iterator[dict]:
    for _, record in _jsonl_numbered(f):
        yield record


def _jsonl_numbered(f: PairFile) -> Iterator[tuple[int, dict]]:
    """(line number, record) of each non-blank line."""
    with open(f.readable, "rb") as stream:
        for number, raw in enumerate(stream, 1):
            text = raw.decode("utf-8-sig" if raw.startswith(b"\xef\xbb\xbf") else "utf-8").strip()
            if text:
                yield number, json.loads(text)


def _jsonl_schema(f: PairFile) -> pa.Schema:
    """One schema for every line of a JSON lines file (a field's types across lines unified).

    Raises:
        DataError: a field whose values cannot share one column, naming its first line that
            does not fit the lines before it.
    """
    schemas = []
    for chunk in _chunks(_jsonl_numbered(f), READ_ROWS):
        try:
            schemas.append(pa.Table.from_pylist([record for _, record in chunk]).schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            raise _mixed_types(f, chunk) from None
    return _unify(schemas, f.path)


def _mixed_types(f: PairFile, chunk: list[tuple[int, dict]]) -> DataError:
    """The first line of ``chunk`` whose value of some field cannot join the same field's values
    on the lines before it."""
    fields = list(dict.fromkeys(key for _, record in chunk for key in record))
    for name in fields:
        values: list = []
        for number, record in chunk:
            values.append(record.get(name))
            try:
                pa.array(values)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                first = next((v for v in values[:-1] if v is not None), None)
                kinds = f"a {_json_kind(values[-1])} where the lines before hold {_json_kind(first)}s" \
                    if first is not None and _json_kind(first) != _json_kind(values[-1]) else f"cannot be stored ({e})"
                return DataError(f.path, number, name, f"{kinds}: the values of a column must be of one type "
                                                       "(quote them all as strings, say)")
    return DataError(f.path, None, None, "its records cannot be stored as one table")


def _json_kind(value) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "list",
            dict: "object"}.get(type(value), type(value).__name__)


def _unify(schemas: list[pa.Schema], where: str) -> pa.Schema:
    if not schemas:
        return pa.schema([])
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowException, TypeError) as e:
        raise DataError(where, None, None, f"the values of a column have types that do not go together: {e}") from None


def _chunks(items, n: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _output_schema(schemas: list[tuple[PairFile, pa.Schema]], columns: ColumnMap, score_column: str) -> pa.Schema:
    """Every input column (the files' schemas unified, in the order first seen), then the score."""
    if not schemas:
        return pa.schema([(score_column, pa.float32())])
    merged = schemas[0][1]
    for f, s in schemas[1:]:
        try:
            merged = pa.unify_schemas([merged, s], promote_options="permissive")
        except (pa.ArrowException, TypeError) as e:
            raise DataError(f.path, None, None, f"its columns cannot share one output table with "
                                                f"{schemas[0][0].path}'s: {e}") from None
    return merged.append(pa.field(score_column, pa.float32()))


# -- reading in shards ------------------------------------------------------------------------
def file_tables(inputs: PairInputs, f: PairFile) -> Iterator[pa.Table]:
    """A file's rows as tables of the output's input columns, in file order."""
    target = pa.schema([fld for fld in inputs.schema if fld.name != inputs.score_column])
    if f.format == "parquet":
        for batch in _parquet(f).iter_batches(batch_size=READ_ROWS):
            yield conform(pa.Table.from_batches([batch]), target)
    elif f.format == "jsonl":
        for chunk in _chunks(_jsonl_records(f), READ_ROWS):
            yield conform(pa.Table.from_pylist(chunk, schema=inputs._jsonl_schemas[f.path]), target)
    else:
        import pyarrow.csv as pacsv

        names = _csv_header(f)
        with open(f.readable, "rb") as stream:
            reader = pacsv.open_csv(
                stream, read_options=pacsv.ReadOptions(block_size=1 << 22),
                parse_options=pacsv.ParseOptions(delimiter="\t" if f.format == "tsv" else ",", newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                     strings_can_be_null=False, quoted_strings_can_be_null=False))
            for batch in reader:
                yield conform(pa.Table.from_batches([batch]), target)


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` with ``target``'s columns and types (a column it lacks filled with nulls)."""
    cols = [table.column(fld.name).cast(fld.type) if fld.name in table.column_names
            else pa.nulls(table.num_rows, fld.type) for fld in target]
    return pa.Table.from_arrays(cols, schema=target)


def candidates_of(rows: pa.Table, columns: ColumnMap, file_index: int, first_row: int) -> pa.Table:
    """The labelling pipeline's view of a shard of input rows (see the module docstring)."""
    n = rows.num_rows
    return pa.table({
        schema.ID1: pa.array(np.full(n, file_index, np.int64)),
        schema.ID2: pa.array(np.arange(first_row, first_row + n, dtype=np.int64)),
        schema.SENTENCE1: rows.column(columns.sentence1).cast(pa.string()),
        schema.SENTENCE2: rows.column(columns.sentence2).cast(pa.string()),
        schema.ORIGIN: pa.array([ORIGIN] * n, pa.string()),
        schema.RETRIEVAL_SCORE: pa.array(np.full(n, np.nan, np.float32)),
    }, schema=schema.CANDIDATE_SCHEMA)


@dataclass(frozen=True)
class Shard:
    index: int  # among every input's shards
    rows: pa.Table  # the input rows (every column)
    candidates: pa.Table  # what the labelling pipeline scores
    first_row: int  # the index in its file of its first row


def shards(inputs: PairInputs, size: int) -> Iterator[Shard]:
    """Every input's rows in shards of ``size`` rows; a shard never spans two files."""
    from augsbert_ray.labeling import exact_shards

    i = 0
    for file_index, f in enumerate(inputs.files):
        first = 0
        for rows in map(pa.Table.combine_chunks, exact_shards(file_tables(inputs, f), size)):
            yield Shard(i, rows, candidates_of(rows, inputs.columns, file_index, first), first)
            i += 1
            first += rows.num_rows
        if first != inputs.rows[file_index]:  # the file changed since it was checked, or a reader disagrees
            raise DataError(f.path, None, None, f"{first} rows read for labelling, {inputs.rows[file_index]} "
                                                "when it was checked; was it changed meanwhile?")
