"""An unlabelled target corpus (domain adaptation, corpus mode), read in streaming shards.

The corpus is one sentence per line (``lines``), a field of JSON lines (``jsonl``) or a
column of CSV, TSV (tab-separated, quotes are text) or Parquet files: one file, a directory (every file under it, hidden ones
aside) or a glob, on local disk or at a storage URI (``s3://...``). Ray Data reads it in
parallel: text files in byte ranges of ``RANGE_BYTES`` cut at line ends, CSV and Parquet
through Ray Data's own readers. Each line is cleaned where it is read:

- whitespace is collapsed and trimmed; a line left empty is dropped (counted);
- a line longer than ``max_chars`` characters is cut at the last space before the limit
  (``long_lines: truncate``, counted) or dropped (``long_lines: drop``, counted);
- a line that is not valid UTF-8 (or, in JSON lines, not an object whose field is a string)
  stops the job with an error naming file, line and field, or with ``on_bad_lines: skip`` is
  left out and counted; a CSV or TSV row with another number of fields than the header, or
  whose text is not UTF-8, stops it (found again line by line, ``bad_row``).

The driver sees the cleaned lines a batch at a time and keeps each distinct sentence once,
in corpus order (files sorted by path), so the raw corpus is never held in its memory; the
distinct sentences are (they are what the samplers index), as Arrow strings (``Distinct``), and
``max_sentences`` caps them with a seeded sample. Every line read is accounted for in the counts.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema
from augsbert_ray.errors import DataError

log = logging.getLogger(__name__)

RANGE_BYTES = 16 << 20  # bytes of a text file per read task
DRIVER_BATCH = 16384  # cleaned lines per batch the driver takes in
FLUSH_LINES = 262_144  # new lines the driver holds before it dedupes them (``Distinct``)
STATUS = "status"
OK, TRUNCATED, EMPTY, TOO_LONG, BAD = "ok", "truncated", "empty", "too_long", "bad"
ERROR = "error"  # a row that carries a bad line's DataError (as JSON) from a read task to the driver
_BOM = b"\xef\xbb\xbf"


@dataclass
class CorpusResult:
    """The distinct sentences of a corpus (``SENTENCE_SCHEMA``) and what happened to every line."""

    sentences: pa.Table
    counts: dict = field(default_factory=dict)
    files: list = field(default_factory=list)  # (path, size in bytes, mtime in ns) of every file read


class Distinct:
    """Each distinct text once, in order of first appearance, held as Arrow strings.

    A Python string and dict entry per sentence took several times the text's own bytes. New
    lines wait in a buffer of at most about ``flush_lines``; a flush keeps the buffer's first
    appearances that are not held yet. Each flush hashes everything held, so flushing in large
    buffers keeps the work close to linear in the corpus.
    """

    def __init__(self, flush_lines: int | None = None):
        self.flush_lines = flush_lines or FLUSH_LINES
        self._held: list[pa.Array] = []
        self._buffer: list[pa.Array] = []
        self._buffered = 0
        self.count = 0  # distinct texts held (the buffer not counted until flushed)

    def add(self, texts: pa.Array) -> None:
        """Takes a batch of texts (nulls are left out)."""
        texts = texts.drop_null()
        if texts.type != pa.string():
            texts = texts.cast(pa.string())
        if len(texts):
            self._buffer.append(texts)
            self._buffered += len(texts)
        if self._buffered >= self.flush_lines:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        new = pc.unique(pa.chunked_array(self._buffer, pa.string()))
        self._buffer, self._buffered = [], 0
        if self._held:
            new = new.filter(pc.invert(pc.is_in(new, value_set=pa.chunked_array(self._held))))
        if len(new):
            self._held.append(new)
            self.count += len(new)

    def texts(self) -> pa.ChunkedArray:
        """Every distinct text, in order of first appearance."""
        self.flush()
        return pa.chunked_array(self._held, pa.string())


def _filesystem(path: str):
    import pyarrow.fs as pafs

    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path


def _glob_match(path: str, pattern: str) -> bool:
    """Glob match by path component: ``*`` stays within one, ``**`` spans any number."""
    p, q = path.split("/"), pattern.split("/")

    def match(i: int, j: int) -> bool:
        if j == len(q):
            return i == len(p)
        if q[j] == "**":
            return any(match(k, j + 1) for k in range(i, len(p) + 1))
        return i < len(p) and fnmatch.fnmatchcase(p[i], q[j]) and match(i + 1, j + 1)

    return match(0, 0)


def list_files(path: str) -> list[tuple[str, int, int | None]]:
    """``(path, size, mtime_ns)`` of the corpus files ``path`` names (a file, a directory or a glob), sorted.

    Names, sizes and modification times stand for a large corpus's contents in a stage fingerprint.

    Raises:
        DataError: if nothing matches.
    """
    import pyarrow.fs as pafs

    fs, base = _filesystem(path)
    prefix = path[: len(path) - len(base)] if "://" in path else ""
    pattern = None
    if any(c in base for c in "*?["):
        parts = base.split("/")
        first = next(i for i, p in enumerate(parts) if any(c in p for c in "*?["))
        pattern, base = base, "/".join(parts[:first]) or "/"
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.File and pattern is None:
        found = [(base, info.size, info.mtime_ns)]
    elif info.type == pafs.FileType.Directory:
        found = [(i.path, i.size, i.mtime_ns) for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
                 if i.type == pafs.FileType.File and not any(p.startswith((".", "_")) for p in
                                                             i.path[len(base):].split("/") if p)
                 and (pattern is None or _glob_match(i.path, pattern))]
    else:
        found = []
    if not found:
        raise DataError(path, None, None, "no corpus files found there (a file, a directory or a glob)")
    return sorted((prefix + p, s, t) for p, s, t in found)


def clean(text: str | None, max_chars: int, long_lines: str) -> tuple[str | None, str]:
    """One line's cleaned text (None if dropped) and its status."""
    if text is None:
        return None, EMPTY
    text = " ".join(text.split())
    if not text:
        return None, EMPTY
    if len(text) <= max_chars:
        return text, OK
    if long_lines == "drop":
        return None, TOO_LONG
    cut = text[:max_chars]
    space = cut.rfind(" ")
    return (cut[:space] if space > 0 else cut), TRUNCATED


def _line_number(path: str, offset: int) -> int:
    """1-based number of the line that starts at byte ``offset`` (counted only on the error path)."""
    fs, p = _filesystem(path)
    n, pos = 1, 0
    with fs.open_input_file(p) as f:
        while pos < offset:
            chunk = f.read_at(min(1 << 24, offset - pos), pos)
            n += chunk.count(b"\n")
            pos += len(chunk)
    return n


def _range_lines(f, size: int, start: int, end: int) -> tuple[int, bytes]:
    """The bytes of the lines that start in ``[start, end)`` and the offset of the first one."""
    if start > 0:
        head = f.read_at(end - (start - 1), start - 1)
        nl = head.find(b"\n")
        if nl < 0:
            return end, b""  # the line straddling this range started before it
        first, body = start + nl, head[nl + 1:]
    else:
        first, body = 0, f.read_at(end, 0)
    pos = end
    while body and not body.endswith(b"\n") and pos < size:  # finish the last line
        chunk = f.read_at(min(1 << 16, size - pos), pos)
        nl = chunk.find(b"\n")
        body += chunk if nl < 0 else chunk[:nl + 1]
        pos += len(chunk)
    return first, body


def read_ranges(batch: dict, fmt: str, column: str | None, max_chars: int, long_lines: str,
                on_bad_lines: str) -> pa.Table:
    """Ray Data task: the cleaned lines of some byte ranges of text files (``lines`` / ``jsonl``)."""
    texts, statuses = [], []

    def table() -> pa.Table:
        return pa.table({schema.TEXT: pa.array(texts, pa.string()), STATUS: pa.array(statuses, pa.string())})

    for path, size, start, end in zip(batch["path"], batch["size"], batch["start"], batch["end"]):
        fs, p = _filesystem(str(path))
        with fs.open_input_file(p) as f:
            first, body = _range_lines(f, int(size), int(start), int(end))
        if first == 0 and body.startswith(_BOM):
            body, first = body[3:], 3
        offset = first
        lines = body.split(b"\n") if body else []  # no line starts in an empty body
        for raw in lines[:-1] if body.endswith(b"\n") else lines:
            line_start, offset = offset, offset + len(raw) + 1
            raw = raw[:-1] if raw.endswith(b"\r") else raw
            try:
                text = raw.decode("utf-8")
                if fmt == "jsonl":
                    if not text.strip():
                        text = None
                    else:
                        try:
                            obj = json.loads(text)
                        except json.JSONDecodeError as e:
                            raise ValueError(None, f"not a JSON object: {e.msg} at column {e.colno}") from None
                        if not isinstance(obj, dict) or column not in obj:
                            raise ValueError(column, "missing (each line must be a JSON object with this field)")
                        text = obj[column]
                        if text is not None and not isinstance(text, str):
                            raise ValueError(column, f"is {type(text).__name__}, not a string")
            except (UnicodeDecodeError, ValueError) as e:
                if on_bad_lines == "skip":
                    texts.append(None)
                    statuses.append(BAD)
                    continue
                if isinstance(e, UnicodeDecodeError):
                    fld, reason = None, f"invalid UTF-8 at byte {e.start} of the line"
                else:
                    fld, reason = e.args
                # The error travels as a row (an exception would reach the driver wrapped by Ray Data).
                texts.append(json.dumps({"path": str(path), "line": _line_number(str(path), line_start), "field": fld,
                                         "reason": reason + " (target.corpus.on_bad_lines: skip leaves such lines "
                                                            "out, counted)"}))
                statuses.append(ERROR)
                return table()
            t, s = clean(text, max_chars, long_lines)
            texts.append(t)
            statuses.append(s)
    return table()


def clean_column(batch: pa.Table, column: str, max_chars: int, long_lines: str) -> pa.Table:
    """Ray Data task: the cleaned values of a CSV / Parquet column."""
    pairs = [clean(t, max_chars, long_lines) for t in batch.column(column).cast(pa.string()).to_pylist()]
    return pa.table({schema.TEXT: pa.array([t for t, _ in pairs], pa.string()),
                     STATUS: pa.array([s for _, s in pairs], pa.string())})


def _parse_options(fmt: str):
    """CSV: comma-separated, double-quoted fields, which may hold newlines; TSV: tab-separated,
    quotes are text."""
    import pyarrow.csv as pacsv

    if fmt == "tsv":
        return pacsv.ParseOptions(delimiter="\t", quote_char=False)
    # Without newlines_in_values, a quoted newline that falls across the reader's 1 MiB blocks
    # stops the read ("CSV parser got out of sync with chunker").
    return pacsv.ParseOptions(newlines_in_values=True)


def header(path: str, fmt: str) -> list[str]:
    """A CSV / TSV file's column names (its first row; a malformed row after it is left to the reading)."""
    import pyarrow.csv as pacsv

    fs, p = _filesystem(path)
    options = _parse_options(fmt)
    options.invalid_row_handler = lambda row: "skip"  # the reader parses a first block to open the file
    with fs.open_input_stream(p) as f:
        return pacsv.open_csv(f, read_options=pacsv.ReadOptions(block_size=1 << 16), parse_options=options).schema.names


def _check_column(files: list[tuple], fmt: str, column: str) -> None:
    """Every CSV / Parquet file has ``column`` (read from its header or footer only)."""
    import pyarrow.parquet as pq

    for path, *_ in files:
        if fmt == "parquet":
            fs, p = _filesystem(path)
            names = pq.read_schema(p, filesystem=fs).names
        else:
            names = header(path, fmt)
        if column not in names:
            raise DataError(path, None if fmt == "parquet" else 1, column,
                            f"no such column (the file has: {', '.join(names)})")


def bad_row(path: str, fmt: str, column: str, reason: str, body: bytes | None = None,
            first_line: int = 1) -> DataError:
    """The ``DataError`` of the first row that the CSV reader refused, found again line by line
    (the error path only): a row with another number of fields than the header, or a column
    value that is not UTF-8. ``body``: a TSV byte range's lines from ``first_line`` on (else the
    whole file is read, header first).
    """
    import csv
    import io
    import re

    names = header(path, fmt)
    if body is not None:  # TSV: quotes are text, a row is a line (ended as the CSV reader ends it)
        lines = re.split(r"\r\n|\r|\n", body.decode("utf-8", "surrogateescape"))
        rows = ((first_line + k, line.split("\t") if line else []) for k, line in enumerate(lines))
        return _first_bad(rows, path, names, column, reason, has_header=first_line == 1)
    fs, p = _filesystem(path)
    limit = csv.field_size_limit()
    csv.field_size_limit(1 << 30)  # a long sentence is no error here
    try:
        with fs.open_input_stream(p) as f:
            text = io.TextIOWrapper(f, encoding="utf-8-sig", errors="surrogateescape", newline="")
            reader = csv.reader(text, delimiter="\t", quoting=csv.QUOTE_NONE) if fmt == "tsv" else csv.reader(text)

            def rows():
                done = 0
                while True:
                    try:
                        record = next(reader)
                    except StopIteration:
                        return
                    except csv.Error as e:
                        raise DataError(path, done + 1, None, f"not {fmt.upper()}: {e}") from None
                    yield done + 1, record
                    done = reader.line_num

            return _first_bad(rows(), path, names, column, reason, has_header=True)
    finally:
        csv.field_size_limit(limit)


def _first_bad(rows, path: str, names: list[str], column: str, reason: str, has_header: bool) -> DataError:
    at = names.index(column)
    try:
        for line, record in rows:
            if has_header:  # the header's own row
                has_header = False
                continue
            if not record:  # an empty line: the reader skips it
                continue
            if len(record) != len(names):
                return DataError(path, line, None, f"{len(record)} fields, the header has {len(names)}")
            try:
                record[at].encode("utf-8")
            except UnicodeEncodeError:
                return DataError(path, line, column, "invalid UTF-8")
    except DataError as e:
        return e
    return DataError(path, None, column, f"unreadable: {reason}")


def corpus_dataset(cfg, files: list[tuple]):
    """The Ray Dataset of cleaned lines (``text``, ``status``), one row per line read."""
    import ray

    kw = {"max_chars": cfg.max_chars, "long_lines": cfg.long_lines}
    if cfg.format in ("lines", "jsonl"):
        ranges = [{"path": p, "size": s, "start": a, "end": min(a + RANGE_BYTES, s)}
                  for p, s, _ in files for a in range(0, s, RANGE_BYTES)]
        if not ranges:
            return ray.data.from_arrow(pa.table({schema.TEXT: pa.array([], pa.string()),
                                                 STATUS: pa.array([], pa.string())}))
        return ray.data.from_items(ranges, override_num_blocks=len(ranges)).map_batches(
            read_ranges, batch_size=1, fn_kwargs={"fmt": cfg.format, "column": cfg.column,
                                                  "on_bad_lines": cfg.on_bad_lines, **kw},
            batch_format="numpy")
    _check_column(files, cfg.format, cfg.column)
    paths = [p for p, *_ in files]
    if cfg.format == "parquet":
        ds = ray.data.read_parquet(paths, columns=[cfg.column])
    else:
        import pyarrow.csv as pacsv

        ds = ray.data.read_csv(paths, parse_options=_parse_options(cfg.format), convert_options=pacsv.ConvertOptions(
            include_columns=[cfg.column], column_types={cfg.column: pa.string()}))
    return ds.map_batches(clean_column, fn_kwargs={"column": cfg.column, **kw}, batch_format="pyarrow")


def read_corpus(cfg, seed: int = 0, files: list[tuple] | None = None) -> CorpusResult:
    """Reads, cleans and deduplicates a corpus (``config.CorpusConfig``) on the running Ray.

    ``files``: the corpus's ``list_files`` result, where the caller has it already.

    Raises:
        DataError: no files, a missing column, or a bad line (``on_bad_lines: error``).
    """
    from ray.data import DataContext

    files = files if files is not None else list_files(cfg.path)
    total = sum(s for _, s, _ in files)
    log.info(f"[corpus] {len(files)} files, {total / 2**20:.1f} MiB, from {cfg.path}")
    ctx = DataContext.get_current()
    saved = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True  # corpus order, so sentence ids are reproducible
    counts = {k: 0 for k in ("lines", OK, TRUNCATED, EMPTY, TOO_LONG, BAD)}
    seen = Distinct()
    t0 = last = time.perf_counter()
    try:
        for batch in corpus_dataset(cfg, files).iter_batches(batch_size=DRIVER_BATCH, batch_format="pyarrow"):
            status = batch.column(STATUS)
            errors = batch.filter(pc.equal(status, ERROR))
            if errors.num_rows:
                raise DataError(**json.loads(errors.column(schema.TEXT)[0].as_py()))
            counts["lines"] += batch.num_rows
            for item in pc.value_counts(status).to_pylist():
                counts[item["values"]] += item["counts"]
            seen.add(batch.column(schema.TEXT).combine_chunks())
            if time.perf_counter() - last > 30:
                last = time.perf_counter()
                log.info(f"[corpus] {counts['lines']:,} lines read, {seen.count:,} distinct sentences so far "
                         f"({counts['lines'] / (last - t0):,.0f} lines/s)")
    except Exception as e:
        # Ray Data's reader refused a row without saying where (pyarrow's ArrowInvalid, raised
        # as it is or wrapped): found again, file by file
        refused = isinstance(e, pa.ArrowInvalid) or "Failed to read CSV file" in str(e)
        if cfg.format not in ("csv", "tsv") or isinstance(e, DataError) or not refused:
            raise
        for path, *_ in files:
            error = bad_row(path, cfg.format, cfg.column, str(e))
            if error.line is not None:
                raise error from None
        raise
    finally:
        ctx.execution_options.preserve_order = saved
    kept = counts[OK] + counts[TRUNCATED]
    texts = seen.texts()
    del seen
    counts.update(duplicates=kept - len(texts), distinct=len(texts), sampled_out=0)
    if cfg.max_sentences is not None and len(texts) > cfg.max_sentences:
        keep = np.sort(np.random.default_rng([seed, 7]).choice(len(texts), cfg.max_sentences, replace=False))
        counts["sampled_out"] = len(texts) - len(keep)
        texts = texts.take(pa.array(keep))
    counts["sentences"] = len(texts)
    log.info(f"[corpus] {counts['lines']:,} lines: {counts[OK]:,} kept as they are, {counts[TRUNCATED]:,} truncated, "
             f"{counts[EMPTY]:,} empty, {counts[TOO_LONG]:,} too long and {counts[BAD]:,} bad left out, "
             f"{counts['duplicates']:,} repeats; {counts['sentences']:,} sentences"
             + (f" (a seeded sample of {counts['distinct']:,})" if counts["sampled_out"] else ""))
    sentences = pa.table({schema.SENTENCE_ID: pa.array(np.arange(len(texts), dtype=np.int64)),
                          schema.TEXT: texts}, schema=schema.SENTENCE_SCHEMA)
    return CorpusResult(sentences, counts, files)
