"""Property-based fuzzing of the gold-pair loaders and the job config reader (hypothesis).

Hypothesis builds files from a mix of valid rows and corruptions (empty files, missing or
extra columns, quoting errors, NaN / inf / out-of-range labels, duplicate pairs, empty or
whitespace-only sentences, extremely long lines, invalid UTF-8, mixed newlines) and keeps,
beside the bytes, what a correct loader must make of every row. Each file is loaded under
``on_bad_rows="error"`` and ``"skip"``: it loads with every row accounted for, or raises
``DataError`` naming the file and a line that exists in it. Job files and ``key=value``
overrides are fuzzed the same way against ``ConfigError``. Any other exception fails.

Whole ``augsbert run`` invocations are fuzzed too (``test_whole_runs_fail_in_one_line_or_reach_ray``):
a job file, overrides, tiny data files and model folders, valid or corrupted, run through
the CLI up to the point where Ray would start. Each is accepted (it reaches that point) or
refused with exit status 2 and one ``augsbert: error:`` line naming a file or a key, with
nothing written into the run directory. Run directories, job names and cluster addresses
are fuzzed the same way (``test_run_directories_and_addresses_fail_in_one_line_or_reach_ray``):
each wrong one is one line naming the run directory, the key, or the address and where it
was given, and leaves nothing behind.

Mistakes knowable before Ray starts (damaged weights, layers or positions a model lacks, a hub
id offline, a GPU this machine lacks, folds past the pairs, booleans for numbers, compressed
data) and ``augsbert report`` on damaged run files have their own section at the end.

``augsbert label`` and ``augsbert bench`` invocations are fuzzed the same way, pair files,
models, options, addresses and output folders for the one, parts, output and data folders,
addresses and models for the other; the Python API's functions get arguments of wrong types
(``test_label_invocations_...``, ``test_bench_invocations_...``, ``test_the_python_api_...``).

Each fuzzing test checks, once hypothesis has run all its examples, that its inputs tested
both outcomes (some accepted, some refused; the pre-flight mistakes: all refused in time:
``_counted``); the figures (inputs tried, accepted, refused with a typed error, tracebacks,
hangs, late failures) are printed by the ``_fuzz_figures`` fixture once the module's tests ran.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import TINY_SAFETENSORS
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from augsbert_ray.config import load_job
from augsbert_ray.errors import ConfigError, DataError
from augsbert_ray.loaders import load_pairs
from augsbert_ray.loaders.mrpc import HEADER as MRPC_HEADER
from augsbert_ray.loaders.stsb import FIELDS as STSB_FIELDS
from augsbert_ray.preflight.model_checks import hub_offline
from augsbert_ray.sources import DataSource


def _fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,  # nothing written into the repository
        print_blob=True,  # a failure prints the @reproduce_failure line that replays it
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# What the module's last step (_fuzz_figures) prints and checks. Every input counts, hypothesis's
# replays included.
FIGURES: dict[str, collections.Counter] = {
    "loaders": collections.Counter(),
    "config": collections.Counter(),
    "run": collections.Counter(),
    "preflight": collections.Counter(),
    "report": collections.Counter(),
}

GOOD, BAD, BLANK, UNKNOWN = "good", "bad", "blank", "unknown"
ANY = "<any>"  # an expected error field or key that is not checked

TEXT_FORMATS = ["stsb", "mrpc", "csv", "tsv", "jsonl"]
CUSTOM_COLUMNS = {"sentence1": "text_a", "sentence2": "text_b", "label": "score", "genre": "domain"}
GENRES = ["main-captions", "main-forums", "main-news"]
PADS = ["", " ", "  ", "\u00a0", " \u3000"]
BLANK_SENTENCES = ["", " ", "   ", "\u00a0", "\u3000 ", "\x0b", "\x0c", "\u2028", " \u2003 "]
# Each is invalid UTF-8 wherever it is inserted (a lone lead, a lone continuation, an
# overlong form, a surrogate, bytes that never occur).
INVALID_UTF8 = [b"\xff", b"\xfe", b"\xc3", b"\xa9", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80"]
NON_FINITE = ["nan", "NaN", "inf", "-inf", "Infinity", "+inf", "-nan", "1e999", "-1e999"]
NOT_NUMBERS = ["", "abc", "1.2.3", "five", "0x1", "--1", "\u00bd", "1,5", "label", "1e", "."]
LONG_LENGTHS = [20_000, 140_000, 300_000]  # csv's field limit (131,072 characters) lies between


# ----------------------------------------------------------------------------------------
# Loading, counting, and what must hold of any outcome
# ----------------------------------------------------------------------------------------


def _attempt(suite: str, typed: type[Exception], call):
    """Runs ``call``; returns (result, None) or (None, the typed error); counts the outcome."""
    FIGURES[suite]["tried"] += 1
    try:
        result = call()
    except typed as e:
        FIGURES[suite]["rejected"] += 1
        return None, e
    except BaseException:
        FIGURES[suite]["untyped"] += 1
        raise
    FIGURES[suite]["accepted"] += 1
    return result, None


def _counted(suite: str, outcome: str = "both"):
    """Checks, once hypothesis has run every example of the test it decorates, what that test's
    inputs came to (``FIGURES[suite]``, counted by this test alone): ``both``: some accepted and
    some refused, so it tested both outcomes; ``refusing``: some refused (inputs built to be
    mostly wrong, or too few examples to count on an accepted one); ``refused``: every one
    refused in time (the pre-flight mistakes), none late, none hung."""
    import functools
    import inspect

    def wrap(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            before = collections.Counter(FIGURES[suite])
            test(*args, **kwargs)
            seen = collections.Counter({k: v - before[k] for k, v in FIGURES[suite].items()})
            assert seen["tried"], f"{test.__name__} tried no input"
            if outcome == "refused":
                assert seen["rejected"] == seen["tried"] and not seen["late"] and not seen["hangs"], dict(seen)
            elif outcome == "refusing":
                assert seen["rejected"], f"{test.__name__} refused none of its inputs: {dict(seen)}"
            else:
                assert seen["accepted"] and seen["rejected"], f"{test.__name__} tested one outcome only: {dict(seen)}"

        run.__signature__ = inspect.signature(test)
        return run

    return wrap


def _rarely(draw, one_in: int) -> bool:
    """True about once in ``one_in`` draws (hypothesis favours a 0 from integers(), so
    ``integers(0, n) == 0`` would be far more common than it reads)."""
    return draw(st.sampled_from([False] * (one_in - 1) + [True]))


def _physical_lines(data: bytes) -> int:
    """Lines as the loaders number them: LF-separated, a final LF ends the last line."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def _load(source: DataSource, mode: str, binary: bool):
    return _attempt(
        "loaders", DataError, lambda: load_pairs(source, "train", binary=binary, on_bad_rows=mode)
    )


def _check_invariants(result, error, path: str, n_lines: int, mode: str) -> None:
    """Holds for any input: a typed error names the file and a real line, or every row is
    loaded (error mode) or loaded-or-listed (skip mode) with clean values."""
    if error is not None:
        assert error.path == path
        assert error.line is None or 1 <= error.line <= n_lines, (error.line, n_lines)
        assert error.field is None or isinstance(error.field, str)
        assert error.reason and str(error).startswith(path)
        return
    table = result.table
    assert result.rows_read == table.num_rows + len(result.skipped)  # nothing silently dropped
    if mode == "error":
        assert result.skipped == []
    rows = table.to_pylist()
    for row in rows:
        assert math.isfinite(row["label"]) and 0.0 <= row["label"] <= 1.0
        for name in ("sentence1", "sentence2"):
            assert row[name] and row[name] == row[name].strip()
        assert 1 <= row["line"] <= n_lines
        assert row["source"] == path and row["split"] == "train"
    lines = [row["line"] for row in rows]
    skipped_lines = [s.line for s in result.skipped]
    assert lines == sorted(set(lines)) and skipped_lines == sorted(set(skipped_lines))
    assert not set(lines) & set(skipped_lines)  # a row is loaded or skipped, not both
    for skipped in result.skipped:
        assert skipped.path == path and 1 <= skipped.line <= n_lines and skipped.reason


# ----------------------------------------------------------------------------------------
# Strategies: sentences and labels
# ----------------------------------------------------------------------------------------

sentence_text = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\t\n\r"),
    min_size=1,
    max_size=12,
).filter(lambda s: s.strip())
sentences = st.builds(
    lambda a, s, b: a + s + b, st.sampled_from(PADS), sentence_text, st.sampled_from(PADS)
)


@dataclass(frozen=True)
class Labels:
    """The raw label range of a file and whether the task is binary."""

    lo: float
    hi: float
    binary: bool

    def scaled(self, raw: object) -> float:
        """The label the table must hold (float32) for a good raw label."""
        return float(np.float32((float(raw) - self.lo) / (self.hi - self.lo)))

    def is_good(self, raw: object) -> bool:
        """The loader's rule, applied to a value of a known type (Parquet's odd columns)."""
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            return False
        try:
            x = float(raw)
        except (ValueError, OverflowError):
            return False
        if not (math.isfinite(x) and self.lo <= x <= self.hi):
            return False
        return not self.binary or (x - self.lo) / (self.hi - self.lo) in (0.0, 1.0)


def _good_label(draw, labels: Labels) -> str:
    lo, hi = labels.lo, labels.hi
    if labels.binary:
        x = draw(st.sampled_from([lo, hi]))
    else:
        frac = draw(st.sampled_from([0.0, 0.2, 0.25, 0.5, 1.0]) | st.floats(0.0, 1.0))
        x = min(max(lo + (hi - lo) * frac, lo), hi)
    form = draw(st.sampled_from(["repr", "g", ".3f", "e", "int"]))
    if form == "int" and x.is_integer():
        text = str(int(x))
    elif form in ("g", ".3f", "e"):
        text = format(x, form)
    else:
        text = repr(x)
    return draw(st.sampled_from(["", " "])) + text


def _bad_label(draw, labels: Labels) -> str:
    lo, hi = labels.lo, labels.hi
    offsets = [0.5, 1.0, 1e-6, 100.0, 1e300]
    choices = NON_FINITE + NOT_NUMBERS + [repr(hi + d) for d in offsets]
    choices += [repr(lo - d) for d in offsets]
    if labels.binary:  # in range, but scales to neither 0 nor 1
        choices += [repr(lo + (hi - lo) * 0.5), repr(lo + (hi - lo) * 0.25)]
    return draw(st.sampled_from(choices))


# ----------------------------------------------------------------------------------------
# Strategies: rows of the text formats
# ----------------------------------------------------------------------------------------


@dataclass
class Row:
    """One generated row: its physical lines and what a correct loader must make of them.

    Attributes:
        lines: the row's physical lines, without line endings.
        kind: GOOD, BAD, BLANK (not a row) or UNKNOWN (after an unterminated quote, whose
            effect on later lines is not predicted).
        pair: for a GOOD row, (sentence1, sentence2, label, genre) as the table must hold it.
        field: for a BAD row, the field its error must name (ANY: not checked).
    """

    lines: list[bytes]
    kind: str
    pair: tuple | None = None
    field: str | None = ANY


@dataclass
class Layout:
    """One format's row: its fields in file order, which one is what, how it is written."""

    fmt: str
    columns: list[str]
    s1: str
    s2: str
    label: str
    genre: str | None

    @property
    def delimiter(self) -> str:
        return "," if self.fmt == "csv" else "\t"

    def render(self, values: dict, quote_all: bool = False) -> bytes:
        if self.fmt == "jsonl":
            return json.dumps(values, ensure_ascii=quote_all).encode()
        if self.fmt in ("stsb", "mrpc"):  # no quoting at all
            return "\t".join(str(v) for v in values.values()).encode()
        return _delimited(list(values.values()), self.delimiter, quote_all).encode()

    def pair(self, values: dict, labels: Labels) -> tuple:
        genre_column = "genre" if self.fmt == "stsb" else self.genre
        genre = None if genre_column is None else str(values[genre_column])
        s1, s2 = values[self.s1].strip(), values[self.s2].strip()
        return (s1, s2, labels.scaled(values[self.label]), genre)


def _delimited(fields: list, delimiter: str, quote_all: bool = False) -> str:
    # The writer quotes a field holding a character of its line terminator, so the
    # terminator must hold both CR and LF; it is cut off again here.
    buf = io.StringIO()
    quoting = csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL
    csv.writer(buf, delimiter=delimiter, lineterminator="\r\n", quoting=quoting).writerow(fields)
    return buf.getvalue().removesuffix("\r\n")


def _values(draw, layout: Layout, labels: Labels) -> dict:
    """A good row's values by column, in file order."""
    label = _good_label(draw, labels)
    s1, s2, genre = draw(sentences), draw(sentences), draw(st.sampled_from(GENRES))
    if layout.fmt == "stsb":
        number = str(draw(st.integers(0, 9999)))
        values = dict(zip(STSB_FIELDS, [genre, "MSRvid", "2012test", number, label, s1, s2]))
        if _rarely(draw, 5):  # news lines carry two more fields
            values["source1"] = values["source2"] = "Europe Media Monitor"
        return values
    if layout.fmt == "mrpc":
        ids = [str(draw(st.integers(1, 10**7))) for _ in range(2)]
        return dict(zip(MRPC_HEADER, [label, *ids, s1, s2]))
    mapped = {layout.s1: s1, layout.s2: s2, layout.label: label, layout.genre: genre}
    return {c: mapped.get(c, f"x{i}") for i, c in enumerate(layout.columns)}


KINDS = ["valid"] * 5 + [
    "dup", "dup", "bad_label", "blank_sentence", "missing_field", "extra_field", "bad_utf8",
    "cr_join", "blank_line", "ws_line", "long",
]
FORMAT_KINDS = {
    "stsb": [],
    "mrpc": ["bad_id"],
    "csv": ["quote_garbage", "bare_quote", "unterminated", "multiline", "quote_all"],
    "tsv": ["quote_garbage", "bare_quote", "unterminated", "multiline", "quote_all"],
    "jsonl": [
        "not_object", "bad_json", "wrong_type", "huge_int", "deep", "surrogate", "number",
        "quote_all",
    ],
}


@st.composite
def rows_of(draw, layout: Layout, labels: Labels, good_so_far: list[dict]) -> Row:
    """One row of ``layout``'s format: valid, a duplicate, or with exactly one corruption."""
    kind = draw(st.sampled_from(KINDS + FORMAT_KINDS[layout.fmt]))
    values = _values(draw, layout, labels)

    def good(vals: dict, quote_all: bool = False) -> Row:
        good_so_far.append(vals)
        lines = layout.render(vals, quote_all).split(b"\n")  # a quoted field may hold LFs
        return Row(lines, GOOD, layout.pair(vals, labels))

    def bad(line: bytes, field: str | None = ANY) -> Row:
        return Row([line], BAD, field=field)

    if kind in ("valid", "quote_all"):
        return good(values, quote_all=kind == "quote_all")
    if kind == "dup":  # the same pair again: duplicates are all kept
        return good(dict(draw(st.sampled_from(good_so_far))) if good_so_far else values)
    if kind == "bad_label":
        raw: object = _bad_label(draw, labels)
        if layout.fmt == "jsonl" and raw in NON_FINITE and draw(st.booleans()):
            raw = float(raw)  # written as JSON's NaN / Infinity
        values[layout.label] = raw
        return bad(layout.render(values), "label")
    if kind == "blank_sentence":
        which = draw(st.sampled_from([0, 1]))
        values[(layout.s1, layout.s2)[which]] = draw(st.sampled_from(BLANK_SENTENCES))
        return bad(layout.render(values), ("sentence1", "sentence2")[which])
    if kind == "missing_field":
        return _missing_field(draw, layout, values)
    if kind == "extra_field":
        if layout.fmt == "jsonl":  # an unmapped key is ignored
            values["unused"] = draw(sentences)
            return good(values)
        line = layout.render(values) + layout.delimiter.encode() + b"extra"
        if layout.fmt == "stsb":  # fields after the seventh are ignored (news sources)
            good_so_far.append(values)
            return Row([line], GOOD, layout.pair(values, labels))
        return bad(line, None)
    if kind == "bad_utf8":
        line = layout.render(values)
        at = draw(st.integers(0, len(line)))
        return bad(line[:at] + draw(st.sampled_from(INVALID_UTF8)) + line[at:], None)
    if kind == "cr_join":  # a lone CR joins two rows: one bad line, never one silent row
        line = layout.render(values) + b"\r" + layout.render(_values(draw, layout, labels))
        return bad(line, {"stsb": ANY, "mrpc": "#2 String"}.get(layout.fmt))
    if kind == "blank_line":
        return Row([b""], BLANK)
    if kind == "ws_line":
        line = draw(st.sampled_from([b" ", b"   ", b"\t", b" \t "]))
        return Row([line], BLANK) if layout.fmt == "jsonl" else bad(line)
    if kind == "long":
        n = draw(st.sampled_from(LONG_LENGTHS))
        values[draw(st.sampled_from([layout.s1, layout.s2]))] = ("long words " * (n // 10))[:n]
        if layout.fmt in ("csv", "tsv") and n > csv.field_size_limit():
            return bad(layout.render(values), None)
        return good(values)
    if kind == "bad_id":
        which = draw(st.sampled_from(["#1 ID", "#2 ID"]))
        values[which] = draw(st.sampled_from(["-1", "12a", "", " 12", "1.5", "\u0661\u0662"]))
        return bad(layout.render(values), which)
    if kind in ("quote_garbage", "bare_quote", "unterminated", "multiline"):
        return _quoting_row(draw, kind, layout, labels, values, good)
    return _jsonl_row(draw, kind, layout, values, good, bad)


def _missing_field(draw, layout: Layout, values: dict) -> Row:
    if layout.fmt == "jsonl":
        required = [c for c in (layout.s1, layout.s2, layout.label, layout.genre) if c]
        dropped = draw(st.lists(st.sampled_from(required), min_size=1, unique=True))
        kept = {k: v for k, v in values.items() if k not in dropped}
        first = next(c for c in required if c in dropped)
        return Row([layout.render(kept)], BAD, field=first)
    names = list(values)[: len(layout.columns)]  # STSb's news fields are not counted
    keep = draw(st.integers(1, len(names) - 1))
    kept = {k: values[k] for k in names[:keep]}
    return Row([layout.render(kept)], BAD, field=names[keep])


def _quoting_row(draw, kind: str, layout: Layout, labels: Labels, values: dict, good) -> Row:
    d = layout.delimiter
    fields = [_delimited([v], d) for v in values.values()]
    if kind in ("quote_garbage", "unterminated"):
        index = draw(st.integers(0, len(fields) - 1))
        text = str(list(values.values())[index])
        if kind == "quote_garbage":  # "text"x: strict csv refuses text after a closing quote
            fields[index] = '"' + text.replace('"', '""') + '"x'
            return Row([d.join(fields).encode()], BAD, field=None)
        # an unterminated quote swallows later lines up to the next quote: not predicted
        fields[index] = '"' + text.replace('"', "")
        return Row([d.join(fields).encode()], UNKNOWN)
    column = draw(st.sampled_from([layout.s1, layout.s2]))
    index = list(values).index(column)
    if kind == "bare_quote":  # a quote inside an unquoted field is just a character
        word = draw(st.text("abc xyz", min_size=1, max_size=6))
        values[column] = fields[index] = "A" + word + '"' + word + "Z"
    else:  # multiline: a quoted field with line breaks spans several physical lines
        values[column] = "\n".join(draw(st.lists(sentence_text, min_size=2, max_size=3)))
        fields[index] = '"' + values[column].replace('"', '""') + '"'
    row = good(values)
    row.lines = d.join(fields).encode().split(b"\n")
    return row


def _jsonl_row(draw, kind: str, layout: Layout, values: dict, good, bad) -> Row:
    def with_raw_label(raw: bytes) -> bytes:
        values[layout.label] = "@@LABEL@@"
        return layout.render(values).replace(b'"@@LABEL@@"', raw)

    if kind == "not_object":
        value = draw(st.sampled_from([[1, 2], 3, "x", None, True, [values]]))
        return bad(json.dumps(value).encode(), None)
    if kind == "bad_json":
        text = layout.render(values)
        cut = draw(st.integers(1, len(text) - 1))
        broken = [text[:cut], text.replace(b'"', b"'"), text[:-1] + b",}"]  # cut, 'quotes', ,}
        return bad(draw(st.sampled_from(broken)), None)
    if kind == "wrong_type":
        which = draw(st.sampled_from(["sentence1", "sentence2", "label"]))
        column = {"sentence1": layout.s1, "sentence2": layout.s2, "label": layout.label}[which]
        odd = [None, [], [0.5], {"a": 1}, True, False] + ([1, 2.5] if which != "label" else [])
        values[column] = draw(st.sampled_from(odd))
        return bad(layout.render(values), which)
    if kind == "huge_int":  # too large for a float (400 digits) or for int() itself (5000)
        digits = draw(st.sampled_from([400, 5000]))
        return bad(with_raw_label(b"1" + b"0" * digits), "label" if digits < 4300 else None)
    if kind == "surrogate":  # a \udc00 escape decodes to a string Arrow cannot hold
        which = draw(st.sampled_from(["sentence1", "sentence2"]))
        values[{"sentence1": layout.s1, "sentence2": layout.s2}[which]] = "a\udc00b"
        return bad(json.dumps(values).encode(), which)
    if kind == "deep":  # nesting past the recursion limit: a bad line, not a crash
        depth = draw(st.sampled_from([50, 100_000]))
        return bad(with_raw_label(b"[" * depth + b"]" * depth), "label" if depth < 1000 else None)
    # number: the label as a JSON number rather than text
    x = float(values[layout.label])
    values[layout.label] = int(x) if x.is_integer() and draw(st.booleans()) else x
    return good(values)


# ----------------------------------------------------------------------------------------
# Strategies: whole text files
# ----------------------------------------------------------------------------------------


@dataclass
class TextCase:
    """A generated file and what loading it must give."""

    data: bytes
    source_kwargs: dict
    binary: bool
    rows: list[tuple[int, Row]]  # (first physical line, row)
    file_error: tuple | None  # (line, field) of a whole-file error, due in both modes


@st.composite
def text_files(draw, fmt: str) -> TextCase:
    source_kwargs: dict = {}
    if fmt in ("stsb", "mrpc"):
        lo, hi = {"stsb": (0.0, 5.0), "mrpc": (0.0, 1.0)}[fmt]
    else:
        lo, hi = source_kwargs["label_range"] = draw(
            st.sampled_from([(0.0, 1.0), (0.0, 5.0), (-1.0, 1.0)])
        )
    labels = Labels(lo, hi, binary=_rarely(draw, 4))
    layout = _layout(draw, fmt, source_kwargs)
    good_so_far: list[dict] = []
    rows = draw(st.lists(rows_of(layout, labels, good_so_far), max_size=8))
    for i, row in enumerate(rows):  # an unterminated quote makes everything after it unknown
        if i and rows[i - 1].kind == UNKNOWN:
            row.kind = UNKNOWN

    header, file_error = _header(draw, layout)
    physical = [header] if header is not None else []
    numbered = []
    for row in rows:
        numbered.append((len(physical) + 1, row))
        physical += row.lines
    n = len(physical)
    endings = draw(st.lists(st.sampled_from([b"\n", b"\r\n"]), min_size=n, max_size=n))
    data = b"".join(line + end for line, end in zip(physical, endings))
    if data and draw(st.booleans()):  # no line ending after the last line
        data = data[:-1]
    if _rarely(draw, 5):
        data = b"\xef\xbb\xbf" + data
    if fmt in ("csv", "tsv", "mrpc") and _rarely(draw, 20):  # an empty file
        data = draw(st.sampled_from([b"", b"\xef\xbb\xbf"]))
        return TextCase(data, source_kwargs, labels.binary, [], (None, None))
    return TextCase(data, source_kwargs, labels.binary, numbered, file_error)


def _layout(draw, fmt: str, source_kwargs: dict) -> Layout:
    if fmt == "stsb":
        return Layout(fmt, list(STSB_FIELDS), "sentence1", "sentence2", "score", None)
    if fmt == "mrpc":
        return Layout(fmt, list(MRPC_HEADER), "#1 String", "#2 String", "Quality", None)
    columns = draw(st.sampled_from([{}, CUSTOM_COLUMNS, {**CUSTOM_COLUMNS, "genre": None}]))
    if columns:
        source_kwargs["columns"] = columns
    s1, s2 = columns.get("sentence1", "sentence1"), columns.get("sentence2", "sentence2")
    label, genre = columns.get("label", "label"), columns.get("genre")
    names = [c for c in (s1, s2, label, genre) if c]
    extra = ["id", "note", "extra col", "x,y", 'q"t']
    names += draw(st.lists(st.sampled_from(extra), unique=True, max_size=2))
    return Layout(fmt, list(draw(st.permutations(names))), s1, s2, label, genre)


def _header(draw, layout: Layout) -> tuple[bytes | None, tuple | None]:
    """The header line (None: the format has none) and the whole-file error it causes."""
    if layout.fmt in ("stsb", "jsonl"):
        return None, None
    fault = draw(st.sampled_from(["none"] * 16 + ["missing", "renamed", "bad_utf8", "quote"]))
    names = list(layout.columns)
    mapped = [c for c in (layout.s1, layout.s2, layout.label, layout.genre) if c]
    gone = draw(st.sampled_from(mapped))
    if fault == "missing":
        names.remove(gone)
    elif fault == "renamed":
        names[names.index(gone)] = "typo_" + gone
    if layout.fmt == "mrpc":
        line = "\t".join(names).encode()
        expected = None if fault == "none" else (1, None)
    else:
        line = _delimited(names, layout.delimiter).encode()
        expected = {"none": None, "missing": (1, gone), "renamed": (1, gone)}.get(fault, (1, None))
    if fault == "bad_utf8":
        line = line[:3] + b"\xff" + line[3:]
    elif fault == "quote":  # text after a closing quote: mrpc sees a wrong header, csv an error
        line = b'"a"x' + layout.delimiter.encode() + line
    return line, expected


# ----------------------------------------------------------------------------------------
# Properties: text formats
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def _check_expected(case: TextCase, mode: str, result, error) -> None:
    """What the generated rows say loading must give, up to the first unpredictable row."""
    if case.file_error is not None:
        assert error is not None, "a whole-file problem is refused in either mode"
        line, field_ = case.file_error
        assert error.line == line and (field_ is ANY or error.field == field_), error
        return
    rows = [(start, row) for start, row in case.rows if row.kind != BLANK]
    cut = next((start for start, row in rows if row.kind == UNKNOWN), math.inf)
    known = [(start, row) for start, row in rows if row.kind != UNKNOWN]
    first = next(((start, row) for start, row in rows if row.kind != GOOD), None)
    if mode == "error" and first is not None:
        if first[1].kind == BAD:
            assert error is not None, f"bad row at line {first[0]} loaded"
            assert error.line == first[0], (error, first[0])
            assert first[1].field is ANY or error.field == first[1].field, (error, first[1].field)
        elif error is not None:
            assert error.line >= first[0]
        return
    if error is not None and cut != math.inf:
        # A quote left open is refused in both modes when it runs to the end of the file or
        # makes one record of more than MAX_RECORD_LINES lines (loaders/tabular.py).
        assert error.line >= cut and ("unterminated quote" in error.reason or "one record spans" in error.reason)
        return
    assert error is None, error  # skip mode, or no bad row: nothing refuses the whole file
    got = [
        ((r["sentence1"], r["sentence2"], r["label"], r["genre"]), r["line"])
        for r in result.table.to_pylist()
        if r["line"] < cut
    ]
    want = [(row.pair, start) for start, row in known if row.kind == GOOD]
    assert got == want
    skipped = [(s.line, s.field) for s in result.skipped if s.line < cut]
    want_skipped = [(start, row.field) for start, row in known if row.kind == BAD]
    assert [line for line, _ in skipped] == [line for line, _ in want_skipped]
    for (_, got_field), (_, want_field) in zip(skipped, want_skipped):
        assert want_field is ANY or got_field == want_field
    if cut == math.inf:
        assert result.rows_read == len(known)
    if mode == "skip":
        pairs = collections.Counter(pair[:2] for pair, _ in got)
        FIGURES["loaders"]["duplicate pairs kept"] += sum(n - 1 for n in pairs.values() if n > 1)


@pytest.mark.parametrize("fmt", TEXT_FORMATS)
@_counted("loaders", "both")
@_fuzz(100)
@given(data=st.data())
def test_text_files_load_every_row_or_fail_typed(workdir, fmt, data):
    case = data.draw(text_files(fmt), label="case")
    path = workdir / f"fuzz-{fmt}.txt"
    path.write_bytes(case.data)
    source = DataSource(format=fmt, path=str(path), **case.source_kwargs)
    for mode in ("error", "skip"):
        result, error = _load(source, mode, case.binary)
        _check_invariants(result, error, str(path), _physical_lines(case.data), mode)
        _check_expected(case, mode, result, error)


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` with a few random byte edits: structural bytes, invalid UTF-8, noise."""
    data = bytearray(data)
    structural = [b"\n", b"\r", b"\r\n", b"\t", b",", b'"', b"{", b"\xff", b"\x00"]
    noise = st.sampled_from(structural) | st.binary(min_size=1, max_size=4)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            data[at:at] = draw(noise)
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        else:
            data[at : at + 1] = draw(noise)
    return bytes(data)


@pytest.mark.parametrize("fmt", TEXT_FORMATS)
@_counted("loaders", "refusing")
@_fuzz(40)
@given(data=st.data())
def test_mutated_or_random_bytes_fail_typed(workdir, fmt, data):
    """Byte-level damage to a file, or plain noise: whatever loads is clean and complete."""
    case = data.draw(text_files(fmt), label="case")
    raw = data.draw(mutated(case.data) | st.binary(max_size=200), label="bytes")
    path = workdir / f"fuzz-mutated-{fmt}.txt"
    path.write_bytes(raw)
    source = DataSource(format=fmt, path=str(path), **case.source_kwargs)
    for mode in ("error", "skip"):
        result, error = _load(source, mode, case.binary)
        _check_invariants(result, error, str(path), _physical_lines(raw), mode)


# ----------------------------------------------------------------------------------------
# Parquet: odd column types, nulls, missing and extra columns, damaged files
# ----------------------------------------------------------------------------------------

UNREADABLE = object()  # a value pyarrow cannot turn into a Python object
LABEL_KINDS = [
    "float64", "float32", "int64", "string", "bool", "null", "decimal", "timestamp", "date32",
    "list",
]


def _sentence_column(draw, n: int) -> pa.Array:
    if not _rarely(draw, 3):  # a clean column
        return pa.array(draw(st.lists(sentences, min_size=n, max_size=n)), pa.string())
    kinds = ["string", "large_string", "dictionary", "binary", "int64", "null"]
    kind = draw(st.sampled_from(kinds))
    if kind == "null":
        return pa.nulls(n)
    if kind == "int64":
        values = draw(st.lists(st.integers(-5, 5) | st.none(), min_size=n, max_size=n))
        return pa.array(values, pa.int64())
    text = sentences | st.sampled_from(BLANK_SENTENCES) | st.none()
    values = draw(st.lists(text, min_size=n, max_size=n))
    if kind == "binary":
        return pa.array([None if v is None else v.encode() for v in values], pa.binary())
    if kind == "dictionary":
        return pa.array(values, pa.string()).dictionary_encode()
    return pa.array(values, pa.string() if kind == "string" else pa.large_string())


def _label_column(draw, n: int, labels: Labels) -> pa.Array:
    lo, hi = labels.lo, labels.hi
    if not _rarely(draw, 3):  # a clean column
        good = st.sampled_from([lo, hi]) if labels.binary else st.floats(lo, hi)
        return pa.array(draw(st.lists(good, min_size=n, max_size=n)), pa.float64())
    kind = draw(st.sampled_from(LABEL_KINDS))
    odd_floats = [lo, hi, (lo + hi) / 2, hi + 0.5, lo - 1e-3, math.nan, math.inf, -math.inf]
    floats = st.sampled_from(odd_floats) | st.floats(lo, hi)

    def column(values_strategy, type_):
        return pa.array(draw(st.lists(values_strategy | st.none(), min_size=n, max_size=n)), type_)

    if kind in ("float64", "float32"):
        return column(floats, pa.float64() if kind == "float64" else pa.float32())
    if kind == "int64":
        return column(st.integers(-2, 6), pa.int64())
    if kind == "string":
        texts = NON_FINITE + NOT_NUMBERS + ["0", "1", " 0.5 ", "5", "2.5e0"]
        return column(st.sampled_from(texts), pa.string())
    if kind == "bool":
        return column(st.booleans(), pa.bool_())
    if kind == "null":
        return pa.nulls(n, pa.float64())
    if kind == "decimal":
        decimals = [Decimal("0.5"), Decimal("1.00"), Decimal("7.25")]
        return column(st.sampled_from(decimals), pa.decimal128(5, 2))
    if kind == "timestamp":  # 2**60 ms lies past year 9999: pyarrow cannot make a datetime of it
        return column(st.sampled_from([0, 10**12, 2**60]), pa.timestamp("ms"))
    if kind == "date32":
        return column(st.sampled_from([0, 2**30]), pa.date32())
    return column(st.lists(floats, max_size=2), pa.list_(pa.float64()))


def _python_values(array: pa.Array) -> list:
    out = []
    for scalar in array:
        try:
            out.append(scalar.as_py())
        except (ValueError, OverflowError):
            out.append(UNREADABLE)
    return out


@dataclass
class ParquetCase:
    table: pa.Table
    source_kwargs: dict
    binary: bool
    expected: list[tuple[str, object]] | None  # per row: (GOOD, pair) or (BAD, field)
    file_error: tuple | None


@st.composite
def parquet_tables(draw) -> ParquetCase:
    n = draw(st.integers(0, 6))
    lo, hi = draw(st.sampled_from([(0.0, 1.0), (0.0, 5.0), (-1.0, 1.0)]))
    labels = Labels(lo, hi, binary=_rarely(draw, 4))
    roles = ["sentence1", "sentence2", "label"] + (["genre"] if draw(st.booleans()) else [])
    columns = dict(zip(roles, roles))
    source_kwargs = {"label_range": (lo, hi), "columns": columns}
    arrays: dict[str, pa.Array] = {}
    for role in roles:
        if _rarely(draw, 25):
            continue  # a missing column
        if role == "label":
            arrays[role] = _label_column(draw, n, labels)
        elif role == "genre":
            genres = st.sampled_from(GENRES) | st.none()
            arrays[role] = pa.array(draw(st.lists(genres, min_size=n, max_size=n)), pa.string())
        else:
            arrays[role] = _sentence_column(draw, n)
    extra = ["id", "", "x y", "\u00e9t\u00e9"]  # unmapped columns, oddly named
    for name in draw(st.lists(st.sampled_from(extra), unique=True, max_size=2)):
        arrays[name] = _sentence_column(draw, n)
    order = draw(st.permutations(list(arrays)))
    table = pa.table({name: arrays[name] for name in order})
    missing = [role for role in roles if role not in arrays]
    if missing:
        return ParquetCase(table, source_kwargs, labels.binary, None, (None, missing[0]))
    values = {role: _python_values(arrays[role]) for role in roles}
    expected = []
    for i in range(n):
        row = {role: values[role][i] for role in roles}
        expected.append(_parquet_expectation(row, labels))
    return ParquetCase(table, source_kwargs, labels.binary, expected, None)


def _parquet_expectation(row: dict, labels: Labels) -> tuple[str, object]:
    for role, value in row.items():  # conversion happens before any check
        if value is UNREADABLE:
            return BAD, role
    for role in ("sentence1", "sentence2"):
        if not (isinstance(row[role], str) and row[role].strip()):
            return BAD, role
    if not labels.is_good(row["label"]):
        return BAD, "label"
    genre = None if row.get("genre") is None else str(row["genre"])
    s1, s2 = row["sentence1"].strip(), row["sentence2"].strip()
    return GOOD, (s1, s2, labels.scaled(row["label"]), genre)


@_counted("loaders", "both")
@_fuzz(100)
@given(
    case=parquet_tables(),
    damage=st.sampled_from(["none"] * 8 + ["truncate", "noise", "empty"]),
    data=st.data(),
)
def test_parquet_loads_every_row_or_fails_typed(workdir, case, damage, data):
    path = workdir / "fuzz.parquet"
    pq.write_table(case.table, path, row_group_size=data.draw(st.integers(1, 4)))
    raw = path.read_bytes()
    if damage == "empty":
        raw = b""
    elif damage == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif damage == "noise":
        raw = data.draw(mutated(raw) | st.binary(max_size=300))
    path.write_bytes(raw)
    source = DataSource(format="parquet", path=str(path), **case.source_kwargs)
    for mode in ("error", "skip"):
        result, error = _load(source, mode, case.binary)
        _check_invariants(result, error, str(path), case.table.num_rows, mode)
        if damage in ("empty", "truncate"):
            assert error is not None and error.line is None
        if damage != "none":
            continue
        if case.file_error is not None:
            assert error is not None and (error.line, error.field) == case.file_error, error
            continue
        bad = [(i + 1, what) for i, (kind, what) in enumerate(case.expected) if kind == BAD]
        if mode == "error" and bad:
            assert error is not None and (error.line, error.field) == bad[0], (error, bad[0])
            continue
        assert error is None, error
        got = [
            ((r["sentence1"], r["sentence2"], r["label"], r["genre"]), r["line"])
            for r in result.table.to_pylist()
        ]
        want = [(pair, i + 1) for i, (kind, pair) in enumerate(case.expected) if kind == GOOD]
        assert got == want
        assert [(s.line, s.field) for s in result.skipped] == bad


# ----------------------------------------------------------------------------------------
# The config reader: job files and key=value overrides
# ----------------------------------------------------------------------------------------

UNSET_VAR = "AUGSBERT_FUZZ_NEVER_SET"
BASE_JOB = {
    "name": "fuzz",
    "data": {
        "train": {"format": "stsb", "path": "a.csv"},
        "dev": None,
        "test": {"format": "csv", "path": "b.csv", "columns": {"label": "score"}},
    },
}
# (dotted key, value, what the loaded config must then hold: a value, or ANY)
GOOD_SETTINGS = [
    ("seed", 7, 7),
    ("task", "binary", "binary"),
    ("bi_encoder.epochs", 3, 3),
    ("sampling.strategy", "rs", "rs"),
    ("sampling.top_k", 5, 5),
    ("data.on_bad_rows", "skip", "skip"),
    ("labeling.num_gpus", 0.5, 0.5),
    ("ray.num_cpus", 2, 2),
    ("data.subsample.train", 10, 10),
    ("evaluation.teacher_check", "stop", "stop"),
    ("sampling.faiss.index", "hnsw", "hnsw"),
    ("cross_encoder.lr", 0.0001, 0.0001),
    ("training.use_gpu", True, True),
    ("data.train.path", "${%s:-x.csv}" % UNSET_VAR, "x.csv"),
    ("bi_encoder.num_layers", None, None),
    ("data.dev", {"format": "jsonl", "path": "d.jsonl"}, ANY),
    ("cross_encoder.train", False, False),
    ("tracking.backend", "tensorboard", "tensorboard"),
    ("tracking.experiment", "exp", "exp"),
]
# (dotted key, value, the key the ConfigError must name, or ANY)
BAD_SETTINGS = [
    ("bi_encoder.epochz", 2, "bi_encoder.epochz"),
    ("foo", 1, "foo"),
    ("data.train.colums", {}, "data.train.colums"),
    ("sampling.faiss.nlist", 3, "sampling.faiss.nlist"),
    ("bi_encoder.epochs", 0, "bi_encoder.epochs"),
    ("task", "multiclass", "task"),
    ("name", "bad name!", "name"),
    ("data.train.format", "xml", "data.train.format"),
    ("data.on_bad_rows", "ignore", "data.on_bad_rows"),
    ("sampling.strategy", "magic", ANY),  # a whole-job check: the message names the key
    ("data.train.label_range", [5, 0], ANY),
    ("labeling.num_gpus", -1, "labeling.num_gpus"),
    ("data.train.path", "${%s}" % UNSET_VAR, "data.train.path"),
    ("seed", "abc", "seed"),
    ("data.dev_fraction", 1.5, "data.dev_fraction"),
    ("tracking.backend", "wandb", "tracking.backend"),
    ("cross_encoder.train", "sometimes", "cross_encoder.train"),
]
REQUIRED = [
    "name", "data", "data.train", "data.dev", "data.test", "data.train.path", "data.test.format",
]
# YAML that PyYAML refuses, or builds into odd values: must come out as a ConfigError or a job.
ODD_YAML = [
    "2020-13-45", "!!int abc", "!!timestamp foo", "!!bool maybe", "!!float x", "&a [*a]",
    "[" * 600 + "]" * 600, "[" * 30 + "]" * 30, "!!binary '###'", "!!python/name:os.system",
    "1e999", ".nan", "0x1F", "0o17", "1_000", "~", "2001-12-14t21:59:43.10-99:99", "[", "{a",
    "'unterminated", "- - -", ": :", "*undefined", "!!set {a, b}", "? [a, b]", "@", "`x",
    "a: b: c", "!!str", "{a: 1, a: 2}", "&x 1", "<<: {a: 1}", "!!omap [a, b]", "\u00e9",
]
BROKEN_LINES = [  # appended to a job file, each makes it invalid YAML
    "key: [unclosed", "key: {a: 1", "\tindent: tab", "a: b: c", "x: *undefined", "- item",
    "@reserved: 1",
]
NOT_MAPPINGS = [
    b"", b"null\n", b"- a\n- b\n", b"42\n", b"'text'\n", b"[1, 2]\n", b"~\n", b"# a comment\n",
]
ANY_VALUE = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
    | st.lists(st.integers(), max_size=2)
)
ODD_KEYS = ["seed", "name", "data.train.path", "a..b", ".", "seed.x", "data.train.path.x", "foo"]


def _set(tree: dict, key: str, value) -> None:
    *parents, last = key.split(".")
    for k in parents:
        if not isinstance(tree.get(k), dict):
            tree[k] = {}
        tree = tree[k]
    tree[last] = value


def _remove(tree: dict, key: str) -> None:
    *parents, last = key.split(".")
    for k in parents:
        tree = tree.get(k) if isinstance(tree, dict) else None
    if isinstance(tree, dict):
        tree.pop(last, None)


def _override(key: str, value) -> str:
    return f"{key}={json.dumps(value)}"  # JSON is YAML


@dataclass
class JobCase:
    data: bytes
    overrides: list[str]
    outcome: str  # "valid", "invalid" or "either"
    key: str | None = ANY  # the key an invalid job's error must name
    holds: tuple = ()  # (dotted key, value) a valid job must hold


@st.composite
def job_files(draw) -> JobCase:
    tree = json.loads(json.dumps(BASE_JOB))
    changes = []  # (key, outcome, expected key or value)
    clean = _rarely(draw, 3)  # a third of the jobs hold only good settings
    for _ in range(draw(st.integers(0, 3))):
        what = "good" if clean else draw(st.sampled_from(["good", "good", "bad", "remove", "odd"]))
        if what == "good":
            key, value, holds = draw(st.sampled_from(GOOD_SETTINGS))
            _set(tree, key, value)
            changes.append((key, "valid", holds))
        elif what == "bad":
            key, value, names = draw(st.sampled_from(BAD_SETTINGS))
            _set(tree, key, value)
            changes.append((key, "invalid", names))
        elif what == "remove":
            key = draw(st.sampled_from(REQUIRED))
            _remove(tree, key)
            changes.append((key, "invalid", key))
        else:
            key = draw(st.sampled_from([k for k, _, _ in GOOD_SETTINGS + BAD_SETTINGS]))
            _set(tree, key, draw(ANY_VALUE))
            changes.append((key, "either", ANY))
    overrides = []
    for _ in range(draw(st.integers(0, 3))):
        choices = ["good", "good", "bad", "malformed", "odd", "odd"]
        what = "good" if clean else draw(st.sampled_from(choices))
        if what == "good":
            key, value, holds = draw(st.sampled_from(GOOD_SETTINGS))
            overrides.append(_override(key, value))
            changes.append((key, "valid", holds))
        elif what == "bad":
            key, value, names = draw(st.sampled_from(BAD_SETTINGS))
            overrides.append(_override(key, value))
            changes.append((key, "invalid", names))
        elif what == "malformed":  # no "=" or no key: refused whatever else the job holds
            overrides.append(draw(st.sampled_from(["noequals", "=1", " =1", "  = x", "seed"])))
            changes.append((None, "refused", ANY))
        else:
            key = draw(st.sampled_from(ODD_KEYS))
            value = draw(st.sampled_from(ODD_YAML) | st.text(max_size=8))
            overrides.append(f"{key}={value}")
            changes.append((key, "either", ANY))

    text = yaml.safe_dump(tree, default_flow_style=draw(st.booleans()), allow_unicode=True)
    damages = ["none"] * 3 + ["odd_line", "broken_line", "bad_utf8", "not_mapping"]
    damage = "none" if clean else draw(st.sampled_from(damages))
    if damage == "odd_line":
        key = draw(st.sampled_from(["seed", "name", "ray", "extra"]))
        text += f"{key}: {draw(st.sampled_from(ODD_YAML))}\n"
        changes.append((key, "either", ANY))
    elif damage == "broken_line":
        text += draw(st.sampled_from(BROKEN_LINES)) + "\n"
    data = text.encode()
    if damage == "bad_utf8":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from(INVALID_UTF8)) + data[at:]
    elif damage == "not_mapping":
        data = draw(st.sampled_from(NOT_MAPPINGS))
    if damage in ("broken_line", "bad_utf8", "not_mapping"):  # the file fails before overrides
        return JobCase(data, overrides, "invalid", key=None)
    return _job_outcome(data, overrides, changes)


def _job_outcome(data: bytes, overrides: list[str], changes: list[tuple]) -> JobCase:
    outcomes = {outcome for _, outcome, _ in changes}
    if "refused" in outcomes:
        return JobCase(data, overrides, "invalid")
    keys = [key for key, _, _ in changes]
    overlapping = any(  # settings of one key, or of a key and a key inside it
        a == b or a.startswith(b + ".") or b.startswith(a + ".")
        for i, a in enumerate(keys)
        for b in keys[i + 1 :]
    )
    if "either" in outcomes or (overlapping and "invalid" in outcomes):
        return JobCase(data, overrides, "either")
    if "invalid" in outcomes:
        invalid = [named for _, outcome, named in changes if outcome == "invalid"]
        return JobCase(data, overrides, "invalid", key=invalid[0] if len(invalid) == 1 else ANY)
    last = dict((key, holds) for key, _, holds in changes)  # the last setting of a key wins
    if overlapping:
        last = {}
    return JobCase(data, overrides, "valid", holds=tuple(last.items()))


def _lookup(cfg, key: str):
    node = cfg
    for k in key.split("."):
        node = node[k] if isinstance(node, dict) else getattr(node, k)
    return node


@_counted("config", "both")
@_fuzz(180)
@given(case=job_files())
def test_job_files_and_overrides_validate_or_fail_typed(workdir, case):
    assert UNSET_VAR not in os.environ
    path = workdir / "job.yaml"
    path.write_bytes(case.data)
    cfg, error = _attempt("config", ConfigError, lambda: load_job(path, case.overrides))
    if error is not None:
        assert error.path == str(path) and str(error).startswith(str(path))
        assert error.key is None or isinstance(error.key, str)
        assert case.outcome != "valid", error
        assert case.key is ANY or error.key == case.key, (error, case.key)
        return
    assert case.outcome != "invalid", "an invalid job was accepted"
    for key, value in case.holds:
        assert value is ANY or _lookup(cfg, key) == value, key


@_counted("config", "refusing")
@_fuzz(60)
@given(raw=st.binary(max_size=300), overrides=st.lists(st.text(max_size=20), max_size=3))
def test_random_config_bytes_and_overrides_fail_typed(workdir, raw, overrides):
    path = workdir / "noise.yaml"
    path.write_bytes(raw)
    _, error = _attempt("config", ConfigError, lambda: load_job(path, overrides))
    assert error is None or error.path == str(path)


# ----------------------------------------------------------------------------------------
# Whole `augsbert run` invocations: everything a job checks before Ray starts
# ----------------------------------------------------------------------------------------


class WouldStartRay(BaseException):
    """Raised where the job would start Ray: everything before it accepted the inputs. (Not an
    Exception: the CLI reports an Exception it did not foresee in one line, and this must reach
    the test.)"""


# Data file kinds, and whether a split of that kind dooms the job (True), lets it through
# (False), or may do either (None), per split ("train" / an evaluation split) and on_bad_rows.
FILE_KINDS = ["valid"] * 6 + [
    "one_row", "constant", "empty", "header_only", "bad_row", "all_bad", "bad_utf8", "unterminated", "missing",
    "folder",
]
# model kinds: (cross_encoder dooms, bi_encoder dooms)
MODEL_KINDS = {
    "embedded": (False, False), "folder": (False, False), "hub_id": (hub_offline(), hub_offline()),
    "pickled": (True, True),
    "decoy": (True, True), "missing_path": (True, True), "st_layout": (True, False), "no_tokenizer": (True, True),
}
JOB_DAMAGE = {  # YAML appended to the job file -> dooms
    "none": False, "duplicate_section": True, "misspelt_key": True, "bad_name": True, "bad_value": True,
}
OVERRIDES = {  # -> dooms
    "seed=3": False, "sampling.top_k=2": False, "data.on_bad_rows=skip": None, "bi_encoder.epochz=2": True,
    "noequals": True, "bi_encoder.epochs=0": True, "name=..": True, "data.subsample.dev=1": True,
}


@dataclass
class RunCase:
    files: dict[str, tuple[str, str, bytes | None]]  # split -> (file name, kind, content; None: no such file)
    models: dict[str, str]  # cross_encoder / bi_encoder -> model kind
    job: str  # the job file's YAML, with {DIR} for the example's folder
    overrides: list[str]
    outcome: str  # accept, reject or either


def _split_dooms(kind: str, evaluation: bool, fmt: str, mode: str) -> bool | None:
    if kind in ("valid", "bad_row", "bad_utf8"):
        return mode == "error" and kind != "valid"
    if kind == "unterminated":
        return fmt == "csv"  # stsb and mrpc quote nothing: a quote is text there
    if kind in ("one_row", "constant"):
        return evaluation
    return True  # empty, header only, all rows bad, missing, a folder


def _data_file(draw, fmt: str, task: str, kind: str) -> bytes | None:
    """A tiny file of ``fmt``; valid rows have distinct labels (both classes for a binary task)."""
    if kind in ("missing", "folder"):
        return None
    n = 1 if kind == "one_row" else draw(st.integers(2, 5))
    first = draw(st.integers(0, 1))
    labels = [((first + i) % 2) if task == "binary" else round((i * 1.3) % 5, 2) for i in range(n)]
    if kind == "constant":
        labels = [labels[0]] * n
    if kind == "all_bad":
        labels = ["x"] * n
    rows = [(f"A man is playing {i}.", f"A woman is eating {i}.", labels[i]) for i in range(n)]
    if kind in ("bad_row", "bad_utf8"):
        rows.insert(draw(st.integers(0, n)), ("A bad row.", "A bad label.", 9 if kind == "bad_row" else "\udcff"))
    if kind == "unterminated":
        rows[0] = ('"' + rows[0][0], *rows[0][1:])
    if fmt == "stsb":
        lines = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{c}\t{a}\t{b}" for i, (a, b, c) in enumerate(rows)]
    elif fmt == "mrpc":
        lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        lines += [f"{c}\t{1000 + i}\t{2000 + i}\t{a}\t{b}" for i, (a, b, c) in enumerate(rows)]
    else:
        lines = ["sentence1,sentence2,label"] + [f"{a},{b},{c}" for a, b, c in rows]
    if kind in ("empty", "header_only"):
        lines = lines[:1] if kind == "header_only" and fmt != "stsb" else []
    return "".join(line + "\n" for line in lines).encode("utf-8", errors="surrogateescape")


@st.composite
def run_cases(draw) -> RunCase:
    task = draw(st.sampled_from(["regression", "binary"]))
    fmt = draw(st.sampled_from(["stsb", "csv"] if task == "regression" else ["mrpc", "csv"]))
    mode = draw(st.sampled_from(["error", "skip"]))
    clean = _rarely(draw, 3)  # a third of the runs hold only good inputs
    dooms: list[bool | None] = []
    files, sources = {}, {}
    carve = not clean and _rarely(draw, 5)
    for split in ("train", "dev", "test"):
        if split == "dev" and carve:
            sources[split] = "null"
            dooms.append(None)  # the carved split may be too small or hold one label
            continue
        kind = "valid" if clean else draw(st.sampled_from(FILE_KINDS))
        name = f"{split}.{'txt' if fmt == 'mrpc' else 'csv'}"
        files[split] = (name, kind, _data_file(draw, fmt, task, kind))
        dooms.append(_split_dooms(kind, split != "train", fmt, mode))
        label_range = ", label_range: [0, 5]" if fmt == "csv" and task == "regression" else ""
        sources[split] = f"{{format: {fmt}, path: '{{DIR}}/{name}'{label_range}}}"
    models = {}
    for i, key in enumerate(("cross_encoder", "bi_encoder")):
        models[key] = "embedded" if clean else draw(st.sampled_from(list(MODEL_KINDS)))
        dooms.append(MODEL_KINDS[models[key]][i])
    damage = "none" if clean else draw(st.sampled_from(list(JOB_DAMAGE)))
    dooms.append(JOB_DAMAGE[damage])
    overrides = draw(st.lists(st.sampled_from([o for o, d in OVERRIDES.items() if d is False or not clean]),
                              max_size=2, unique=True))
    for o in overrides:
        dooms.append(OVERRIDES[o] if o != "data.on_bad_rows=skip" else (False if mode == "skip" else None))
    lines = ["name: fuzz-run", f"task: {task}", "run_dir: '{DIR}/run'", "data:"]
    lines += [f"  {split}: {source}" for split, source in sources.items()]
    lines += [f"  on_bad_rows: {mode}", "  dev_fraction: 0.5"]
    lines += [f"{key}: {{model: '{MODEL_PATHS[kind]}'}}" for key, kind in models.items()]
    lines += {"none": [], "duplicate_section": ["sampling: {top_k: 2}", "sampling: {top_k: 5}"],
              "misspelt_key": ["bi_encoder_: {epochs: 2}"], "bad_name": ["name: .."],
              "bad_value": ["labeling: {num_gpus: -1}"]}[damage]
    if damage == "bad_name":
        lines.remove("name: fuzz-run")
    outcome = "reject" if True in dooms else "either" if None in dooms else "accept"
    return RunCase(files, models, "\n".join(lines) + "\n", overrides, outcome)


MODEL_PATHS = {"embedded": "embedded", "folder": "{DIR}/models/folder", "hub_id": "some-org/some-model",
               "pickled": "{DIR}/models/pickled", "decoy": "{DIR}/models/decoy", "missing_path": "./no/such/model",
               "st_layout": "{DIR}/models/st_layout", "no_tokenizer": "{DIR}/models/no_tokenizer"}


def _model_folders(root) -> None:
    """Model folders as the checks see them (names of files; nothing before Ray loads weights)."""
    def folder(path, weights, tokenizer=True):
        path.mkdir(parents=True)
        (path / "config.json").write_text('{"model_type": "bert"}')
        for name in weights:
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes(TINY_SAFETENSORS if name.endswith(".safetensors") else b"\0")
        if tokenizer:
            (path / "tokenizer.json").write_text("{}")

    folder(root / "folder", ["model.safetensors"])
    folder(root / "pickled", ["pytorch_model.bin"])
    folder(root / "decoy", ["pytorch_model.bin", "x/dummy.safetensors"])
    folder(root / "no_tokenizer", ["model.safetensors"], tokenizer=False)
    folder(root / "st_layout" / "0_Transformer", ["model.safetensors"])
    (root / "st_layout" / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"}]))


@_counted("run", "both")
@_fuzz(150)
@given(case=run_cases())
def test_whole_runs_fail_in_one_line_or_reach_ray(workdir, case):
    import tempfile
    import time
    from pathlib import Path
    from unittest import mock

    from augsbert_ray import runtime
    from augsbert_ray.cli import main

    folder = Path(tempfile.mkdtemp(dir=workdir, prefix="run-"))
    _model_folders(folder / "models")
    named = [str(folder / "job.yaml")]
    for name, kind, content in case.files.values():
        named.append(str(folder / name))
        if kind == "folder":
            (folder / name).mkdir()
        elif content is not None:
            (folder / name).write_bytes(content)
    named += [MODEL_PATHS[kind].replace("{DIR}", str(folder)) for kind in case.models.values()]
    (folder / "job.yaml").write_text(case.job.replace("{DIR}", str(folder)), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    FIGURES["run"]["tried"] += 1
    t0 = time.perf_counter()
    with mock.patch.object(runtime, "start_ray", side_effect=WouldStartRay), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["run", named[0], *case.overrides])
        except WouldStartRay:
            rc = None
        except BaseException:
            FIGURES["run"]["untyped"] += 1
            raise
    FIGURES["run"]["hangs"] += time.perf_counter() - t0 > HANG_S
    assert time.perf_counter() - t0 <= HANG_S, f"{time.perf_counter() - t0:.0f} s for {case}"
    assert "Traceback" not in out.getvalue() + err.getvalue()
    if rc is None:
        FIGURES["run"]["accepted"] += 1
        FIGURES["run"]["late"] += case.outcome == "reject"  # doomed, yet it would have started Ray
        assert case.outcome != "reject", f"accepted a doomed job: {case}"
        return
    FIGURES["run"]["rejected" if rc == 2 else "untyped"] += 1
    assert rc == 2, (rc, err.getvalue())
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("augsbert: error: "), err.getvalue()
    assert any(path in lines[0] for path in named), lines[0]  # names the job file, a data file or a model
    assert not (folder / "run").exists(), "a refused job wrote into its run directory"
    assert case.outcome != "accept", f"refused a good job: {lines[0]}"


# ----------------------------------------------------------------------------------------
# Regressions: inputs that escaped as untyped errors or were silently mangled
# ----------------------------------------------------------------------------------------


def _one_jsonl_row(tmp_path, label: bytes) -> DataSource:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"sentence1": "a", "sentence2": "b", "label": ' + label + b"}\n")
    return DataSource(format="jsonl", path=str(path))


@pytest.mark.parametrize(
    ("label", "field"),
    [
        (b"1" + b"0" * 400, "label"),  # was OverflowError: int too large to convert to float
        (b"1" + b"0" * 5000, None),  # was ValueError: exceeds the limit for int conversion
        (b"[" * 100_000 + b"]" * 100_000, None),  # was RecursionError
    ],
    ids=["400-digit-int", "5000-digit-int", "deep-nesting"],
)
def test_regression_jsonl_huge_or_deep_values_are_bad_rows(tmp_path, label, field):
    source = _one_jsonl_row(tmp_path, label)
    with pytest.raises(DataError) as info:
        load_pairs(source, "train")
    assert (info.value.line, info.value.field) == (1, field)
    result = load_pairs(source, "train", on_bad_rows="skip")
    assert result.rows_read == 1 and result.table.num_rows == 0 and len(result.skipped) == 1


@pytest.mark.parametrize("genre", [None, "domain"])
def test_regression_jsonl_lone_surrogate_is_a_bad_row(tmp_path, genre):
    # json.loads turns "\udc00" into a lone surrogate; building the Arrow table then raised
    # UnicodeEncodeError, in either mode.
    path = tmp_path / "p.jsonl"
    record = {"sentence1": "a\udc00", "sentence2": "b", "label": 1, "domain": "x"}
    if genre:
        record = {**record, "sentence1": "a", "domain": "\ud800"}
    path.write_text(json.dumps(record) + "\n", encoding="ascii")
    source = DataSource(format="jsonl", path=str(path), columns={"genre": "domain"})
    with pytest.raises(DataError) as info:
        load_pairs(source, "train")
    assert (info.value.line, info.value.field) == (1, "genre" if genre else "sentence1")
    assert "surrogate" in info.value.reason
    assert load_pairs(source, "train", on_bad_rows="skip").rows_read == 1


def test_regression_parquet_value_python_cannot_hold_is_a_bad_row(tmp_path):
    # 2**60 ms is past year 9999: to_pylist raised OverflowError for the whole file.
    path = tmp_path / "p.parquet"
    labels = pa.array([0, 2**60], pa.timestamp("ms"))
    table = pa.table({"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": labels})
    pq.write_table(table, path)
    source = DataSource(format="parquet", path=str(path))
    with pytest.raises(DataError) as info:
        load_pairs(source, "train")
    assert (info.value.line, info.value.field) == (1, "label")  # a datetime is no label either
    result = load_pairs(source, "train", on_bad_rows="skip")
    assert [(s.line, s.field) for s in result.skipped] == [(1, "label"), (2, "label")]
    assert "cannot be read" in result.skipped[1].reason


def test_regression_stsb_lone_cr_does_not_swallow_a_row(tmp_path):
    # STSb ignores fields after the seventh, so two rows joined by a lone CR loaded as one.
    path = tmp_path / "sts.csv"
    row = "main-captions\tMSRvid\t2012test\t0001\t{}\tA {}.\tB {}."
    text = f"{row.format(5, 1, 1)}\r{row.format(4, 2, 2)}\n{row.format(3, 3, 3)}\n"
    path.write_bytes(text.encode())
    source = DataSource(format="stsb", path=str(path))
    with pytest.raises(DataError) as info:
        load_pairs(source, "train")
    assert (info.value.line, info.value.field) == (1, "sentence2")
    result = load_pairs(source, "train", on_bad_rows="skip")
    assert result.rows_read == 2 and [s.line for s in result.skipped] == [1]
    assert result.table.column("sentence1").to_pylist() == ["A 3."]


@pytest.mark.parametrize("data", [b"", b"\xef\xbb\xbf"], ids=["empty", "bom-only"])
def test_regression_empty_mrpc_file_names_no_line(tmp_path, data):
    path = tmp_path / "msr.txt"
    path.write_bytes(data)
    with pytest.raises(DataError) as info:  # it named line 1 of a file with no lines
        load_pairs(DataSource(format="mrpc", path=str(path)), "train", on_bad_rows="skip")
    assert info.value.line is None and "empty file" in info.value.reason


@pytest.mark.parametrize(
    "value",
    [
        "2020-13-45", "!!int abc", "!!float x", "!!bool maybe", "!!timestamp foo", "[", "&a [*a]",
        "[" * 600,
    ],
)
@pytest.mark.parametrize("where", ["override", "file"])
def test_regression_yaml_pyyaml_cannot_build_is_a_config_error(tmp_path, value, where):
    # PyYAML raised ValueError / KeyError / AttributeError / RecursionError for these,
    # and a bad override value escaped as yaml's own error.
    text = yaml.safe_dump(BASE_JOB)
    overrides = [f"seed={value}"] if where == "override" else []
    path = tmp_path / "job.yaml"
    path.write_text(text + (f"seed: {value}\n" if where == "file" else ""), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_job(path, overrides)
    assert info.value.path == str(path)
    if where == "override" and value != "&a [*a]":  # the recursive alias fails after parsing
        assert info.value.key == "seed"


# ----------------------------------------------------------------------------------------
# Damaged run-directory files and the pre-flight checks: every input here is a mistake
# ----------------------------------------------------------------------------------------
# Each `augsbert run` below holds one mistake that is knowable before Ray starts (damaged
# weights, layers or positions a model lacks, a hub id while the hub is off, a GPU this machine
# lacks, more folds than pairs, a boolean for a number, pilot_folds without the pilot, a
# compressed data file): it must end in one `augsbert: error:` line naming the key and the
# file, with exit status 2, within HANG_S seconds, before Ray would start (reaching Ray is a
# late failure) and before the run directory exists. Each `augsbert report` reads a
# metrics.json (and job log) damaged at random: it prints the summary, or one error line
# naming the file; never a traceback.

HANG_S = 30  # far beyond the second or so a pre-flight refusal takes, even on a busy machine
MODEL_LAYERS, MODEL_POSITIONS = 2, 64
NUMBER_KEYS = ["sampling.top_k", "cross_encoder.epochs", "bi_encoder.num_layers", "cross_encoder.lr",
               "bi_encoder.batch_size", "labeling.actors", "training.num_workers", "seed", "data.dev_fraction",
               "evaluation.pilot_fraction", "seed_search.seeds", "auto.budget_minutes", "data.subsample.train"]
BOOL_WORDS = ["true", "false", "yes", "no", "on", "off", "True", "YES"]
GPU_SETTINGS = ["training.use_gpu=true", "labeling.num_gpus=1", "labeling.num_gpus=0.5",
                "sampling.faiss.shard_gpus=1", "seed_search.gpus_per_trial=1"]
PREFLIGHT_KINDS = ["weights", "layers", "length", "hub_offline", "gpu", "folds", "folds_without_pilot", "boolean",
                   "compressed", "given_teacher", "tracking_module"]
TRACKING_MODULES = {"mlflow": "mlflow", "tensorboard": "tensorboard"}  # backend -> the module it needs
WEIGHT_DAMAGE = ["truncated", "random_bytes", "huge_header", "garbage_header", "wrong_shape"]


def _tiny_weights() -> bytes:
    from conftest import safetensors_bytes

    return safetensors_bytes({"embeddings.weight": [8, 4], "encoder.layer.0.weight": [4, 4]})


@dataclass
class PreflightCase:
    kind: str
    overrides: list[str]
    key: str  # the key the error must name
    damage: dict  # what to break on disk: {"weights": (encoder, bytes)} or {"compressed": (split, codec)}


@st.composite
def preflight_cases(draw) -> PreflightCase:
    kind = draw(st.sampled_from(PREFLIGHT_KINDS))
    encoder = draw(st.sampled_from(["cross_encoder", "bi_encoder"]))
    if kind == "weights":
        good = _tiny_weights()
        how = draw(st.sampled_from(WEIGHT_DAMAGE))
        n = int.from_bytes(good[:8], "little")
        if how == "truncated":
            data = good[:draw(st.integers(0, len(good) - 1))]
        elif how == "random_bytes":
            data = draw(st.binary(min_size=0, max_size=600))
            # a few random bytes could in principle form a valid file; the draw is redrawn then
            from hypothesis import assume

            assume(not (len(data) >= 8 and 8 + int.from_bytes(data[:8], "little") <= len(data)))
        elif how == "huge_header":
            data = draw(st.integers(len(good), 2**64 - 1)).to_bytes(8, "little") + good[8:]
        elif how == "garbage_header":
            data = good[:8] + draw(st.binary(min_size=n, max_size=n).filter(lambda b: not b.startswith(b"{"))) \
                + good[8 + n:]
        else:
            header = json.loads(good[8:8 + n])
            header["embeddings.weight"]["shape"] = [8, draw(st.integers(5, 1000))]
            raw = json.dumps(header).encode()
            data = len(raw).to_bytes(8, "little") + raw + good[8 + n:]
        return PreflightCase(kind, [], f"{encoder}.model", {"weights": (encoder, data)})
    if kind == "layers":
        return PreflightCase(kind, [f"bi_encoder.num_layers={draw(st.integers(MODEL_LAYERS + 1, 10**6))}"],
                             "bi_encoder.num_layers", {})
    if kind == "length":
        return PreflightCase(kind, [f"{encoder}.max_length={draw(st.integers(MODEL_POSITIONS + 1, 10**7))}"],
                             f"{encoder}.max_length", {})
    if kind == "hub_offline":
        hub_id = draw(st.from_regex(r"[a-z][a-z0-9-]{0,8}/[a-z][a-z0-9_-]{0,12}", fullmatch=True))
        return PreflightCase(kind, [f"{encoder}.model={hub_id}"], f"{encoder}.model", {"hub": encoder})
    if kind == "gpu":
        setting = draw(st.sampled_from(GPU_SETTINGS))
        return PreflightCase(kind, [setting], setting.split("=")[0], {})
    if kind == "folds":
        return PreflightCase(kind, ["evaluation.pilot=true", f"evaluation.pilot_folds={draw(st.integers(5, 10**6))}"],
                             "evaluation.pilot_folds", {})
    if kind == "folds_without_pilot":
        return PreflightCase(kind, [f"evaluation.pilot_folds={draw(st.integers(2, 500))}"], "evaluation.pilot_folds",
                             {})
    if kind == "boolean":
        key = draw(st.sampled_from(NUMBER_KEYS))
        return PreflightCase(kind, [f"{key}={draw(st.sampled_from(BOOL_WORDS))}"], key, {})
    if kind == "given_teacher":  # the job's cross-encoder folder has no classification head
        return PreflightCase(kind, ["cross_encoder.train=false"], "cross_encoder.model", {})
    if kind == "tracking_module":  # the backend's module looks uninstalled
        backend = draw(st.sampled_from(sorted(TRACKING_MODULES)))
        return PreflightCase(kind, [f"tracking.backend={backend}"], "tracking.backend",
                             {"missing_module": TRACKING_MODULES[backend]})
    split = draw(st.sampled_from(["train", "dev", "test"]))
    return PreflightCase(kind, [], f"data.{split}.path",
                         {"compressed": (split, draw(st.sampled_from(["gzip", "bz2", "xz", "zip"])))})


def _compress(data: bytes, codec: str) -> bytes:
    import bz2
    import gzip
    import lzma
    import zipfile

    if codec == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr("train.csv", data)
        return buffer.getvalue()
    return {"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[codec](data)


def _preflight_folder(workdir, case: PreflightCase):
    """A job with good inputs (two local models, three STSb files) but for the case's mistake."""
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(dir=workdir, prefix="pre-"))
    for split, verb in (("train", "playing"), ("dev", "singing"), ("test", "reading")):
        rows = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{i + 0.5}\tA man is {verb} {i}.\tA dog {i}." for i in range(4)]
        data = "".join(r + "\n" for r in rows).encode()
        if case.damage.get("compressed", (None,))[0] == split:
            data = _compress(data, case.damage["compressed"][1])
        (folder / f"{split}.csv").write_bytes(data)
    for encoder in ("cross_encoder", "bi_encoder"):
        model = folder / encoder
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": MODEL_LAYERS,
                                                       "max_position_embeddings": MODEL_POSITIONS}))
        (model / "tokenizer.json").write_text("{}")
        weights = case.damage.get("weights")
        (model / "model.safetensors").write_bytes(weights[1] if weights and weights[0] == encoder else _tiny_weights())
    lines = ["name: pre", f"run_dir: '{folder}/run'", "data:"]
    lines += [f"  {s}: {{format: stsb, path: '{folder}/{s}.csv'}}" for s in ("train", "dev", "test")]
    lines += [f"{e}: {{model: '{folder / e}', max_length: 32}}" for e in ("cross_encoder", "bi_encoder")]
    (folder / "job.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@_counted("preflight", "refused")
@_fuzz(60)
@given(case=preflight_cases())
def test_mistakes_knowable_before_ray_fail_there_in_one_line(workdir, case):
    import time
    from unittest import mock

    from huggingface_hub import constants

    from augsbert_ray import runtime
    from augsbert_ray.cli import main
    from augsbert_ray.preflight import resource_checks

    folder = _preflight_folder(workdir, case)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"HF_HUB_OFFLINE": "1"}
    import importlib.util

    from augsbert_ray.preflight import tracking_checks

    missing, find = case.damage.get("missing_module"), importlib.util.find_spec
    out, err = io.StringIO(), io.StringIO()
    FIGURES["preflight"]["tried"] += 1
    t0 = time.perf_counter()
    with mock.patch.object(runtime, "start_ray", side_effect=WouldStartRay), \
            mock.patch.object(resource_checks, "gpu_visible", return_value=False), \
            mock.patch.object(resource_checks, "joined_ray", return_value=False), \
            mock.patch.object(constants, "HF_HUB_CACHE", str(folder / "hub-cache")), \
            mock.patch.object(tracking_checks.importlib.util, "find_spec",
                              side_effect=lambda name, *a: None if name == missing else find(name, *a)), \
            mock.patch.dict(os.environ, env, clear=True), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["run", str(folder / "job.yaml"), *case.overrides])
        except WouldStartRay:
            rc = None
        except BaseException:
            FIGURES["preflight"]["tracebacks"] += 1
            raise
    seconds = time.perf_counter() - t0
    if seconds > HANG_S:
        FIGURES["preflight"]["hangs"] += 1
    if rc is None:
        FIGURES["preflight"]["late"] += 1
    assert "Traceback" not in out.getvalue() + err.getvalue()
    assert rc is not None, f"reached Ray: {case}"
    assert seconds <= HANG_S, f"{seconds:.0f} s to refuse {case}"
    lines = err.getvalue().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("augsbert: error: "), err.getvalue()
    parent, _, leaf = case.key.rpartition(".")  # an entry of a mapping (data.subsample) is named in its key's message
    entry = f"key '{parent}' {parent.split('.')[-1]}.{leaf} in "
    assert case.key in lines[0] or entry in lines[0], (case, lines[0])
    assert str(folder) in lines[0], (case, lines[0])
    if "weights" in case.damage:
        assert "model.safetensors" in lines[0], lines[0]
    assert not (folder / "run").exists()
    FIGURES["preflight"]["rejected"] += 1


def _run_metrics() -> dict:
    from augsbert_ray.metrics import ClusterInfo, RunMetrics, StageRecord
    from augsbert_ray.stages.evaluate import EvalResult
    from augsbert_ray.stages.gold import GoldResult

    scores = {"dev": {"spearman": 70.0}, "test": {"spearman": 68.0}}
    m = RunMetrics(job="r", task="regression", primary_metric="spearman", run_dir="runs/r", complete=False,
                   stages=[StageRecord(name="gold", kind="load", fingerprint="ab12", seconds=0.4, reused=False,
                                       result=GoldResult(train=40, dev=20, test=20)),
                           StageRecord(name="eval_gold_only", kind="evaluate", fingerprint="cd34", seconds=0.4,
                                       reused=False, result=EvalResult(model="gold_only", scores=scores))],
                   stages_planned=["gold", "gold_only", "eval_gold_only"],
                   cluster=ClusterInfo(cpus=2.0, gpus=0.0, nodes=1))
    return m.to_dict()


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=6)


@st.composite
def damaged_metrics(draw) -> bytes | None:
    """A run's metrics.json damaged one way (None: a folder in its place)."""
    good = _run_metrics()
    text = json.dumps(good, indent=2).encode()
    how = draw(st.sampled_from(["truncated", "random_bytes", "flipped_byte", "field_replaced", "field_removed",
                                "nested_replaced", "not_an_object", "folder", "empty"]))
    if how == "truncated":
        return text[:draw(st.integers(0, len(text) - 1))]
    if how == "random_bytes":
        return draw(st.binary(max_size=300))
    if how == "flipped_byte":
        i = draw(st.integers(0, len(text) - 1))
        return text[:i] + bytes([text[i] ^ draw(st.integers(1, 255))]) + text[i + 1:]
    if how == "field_replaced":
        good[draw(st.sampled_from(sorted(good)))] = draw(JSON_VALUES)
    elif how == "field_removed":
        del good[draw(st.sampled_from(sorted(good)))]
    elif how == "nested_replaced":
        section = draw(st.sampled_from(["scores", "data", "stages", "cluster"]))
        if section == "stages":
            good["stages"][0][draw(st.sampled_from(sorted(good["stages"][0])))] = draw(JSON_VALUES)
        elif section == "scores":
            good["scores"]["gold_only"][draw(st.sampled_from(["dev", "test"]))] = draw(JSON_VALUES)
        else:
            good[section][draw(st.sampled_from(sorted(good[section])))] = draw(JSON_VALUES)
    elif how == "not_an_object":
        return json.dumps(draw(st.lists(JSON_VALUES, max_size=2) | st.integers() | st.text(max_size=5))).encode()
    elif how == "folder":
        return None
    else:
        return b""
    return json.dumps(good).encode()


@_counted("report", "both")
@_fuzz(150)
@given(metrics=damaged_metrics(), log=st.none() | st.binary(max_size=200))
@example(metrics=json.dumps({**_run_metrics(), "job": "s"}, indent=2).encode(), log=None)  # a byte flipped in the name
def test_report_on_damaged_run_files_prints_or_fails_in_one_line(workdir, metrics, log):
    import tempfile
    import time
    from pathlib import Path

    from augsbert_ray.cli import main

    folder = Path(tempfile.mkdtemp(dir=workdir, prefix="report-"))
    path = folder / "metrics.json"
    if metrics is None:
        path.mkdir()
    else:
        path.write_bytes(metrics)
    if log is not None:
        (folder / "logs").mkdir()
        (folder / "logs" / "job.log").write_bytes(log)
    out, err = io.StringIO(), io.StringIO()
    FIGURES["report"]["tried"] += 1
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["report", str(folder)])
        except BaseException:
            FIGURES["report"]["tracebacks"] += 1
            raise
    FIGURES["report"]["hangs"] += time.perf_counter() - t0 > HANG_S
    assert time.perf_counter() - t0 <= HANG_S
    if rc == 0:
        FIGURES["report"]["accepted"] += 1
        # the title names the job the metrics name: a flipped byte may leave another valid name
        assert re.match(r"# [^\n]+: AugSBERT", out.getvalue()) and not err.getvalue(), out.getvalue()[:200]
        return
    lines = err.getvalue().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"augsbert: error: {path}"), err.getvalue()
    FIGURES["report"]["rejected"] += 1


# ----------------------------------------------------------------------------------------
# Whole `augsbert run` invocations: run directories, job names and cluster addresses
# ----------------------------------------------------------------------------------------

# run_dir kinds -> whether they doom the job. {DIR} is the example's folder, {NAME} the job's name.
PLACES = {
    "plain": ("{DIR}/runs/${name}", False), "nested": ("{DIR}/a/b/c", False), "tilde": ("~/runs/${name}", False),
    "existing": ("{DIR}/existing", False), "stale_lock": ("{DIR}/stale", False), "empty": ("", True),
    "file": ("{DIR}/afile", True), "under_file": ("{DIR}/afile/run", True), "proc": ("/proc/augsbert/run", True),
    "long_component": ("{DIR}/" + "d" * 300, True), "unknown_scheme": ("foo://bar/run", True),
    "held": ("{DIR}/held", True),
}
NAMES = {"fuzz-places": False, "n" * 255: False, "n" * 300: True}
# Cluster addresses -> whether they doom the job; {PORT}: a gRPC server's port (as Ray's GCS is),
# {PLAIN}: a port where something that is not one listens, {CLOSED}: one where nothing does.
ADDRESSES = {
    None: False, "127.0.0.1:{PORT}": False, "ray://127.0.0.1:{PORT}": False, "127.0.0.1:{CLOSED}": True,
    "ray://127.0.0.1:{CLOSED}": True, "127.0.0.1:{PLAIN}": True, "nonsense": True, "127.0.0.1:99999": True,
    "head:": True,
}
ADDRESS_ORIGINS = {"flag": "--address", "override": "the override ray.address=", "job": "ray.address in",
                   "env": "the RAY_ADDRESS environment variable"}
FIGURES["places"] = collections.Counter()


@st.composite
def place_cases(draw) -> dict:
    return {"place": draw(st.sampled_from(list(PLACES))), "name": draw(st.sampled_from(list(NAMES))),
            "address": draw(st.sampled_from(list(ADDRESSES))), "via": draw(st.sampled_from(list(ADDRESS_ORIGINS)))}


@pytest.fixture(scope="module")
def listening_ports():
    """(a gRPC server's port, a plain listener's port)."""
    import socket
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield port, s.getsockname()[1]
    server.stop(None)


@_counted("places", "refusing")
@_fuzz(16)
@given(case=place_cases())
def test_run_directories_and_addresses_fail_in_one_line_or_reach_ray(workdir, listening_ports, case):
    import contextlib
    import io
    import socket
    import tempfile
    from pathlib import Path
    from unittest import mock

    from augsbert_ray import cluster_address, runtime
    from augsbert_ray.cli import main
    from augsbert_ray.run_lock import LOCK_NAME, RunLock

    folder = Path(tempfile.mkdtemp(dir=workdir, prefix="place-"))
    (folder / "afile").write_text("not a directory")
    (folder / "existing").mkdir()
    (folder / "stale").mkdir()
    (folder / "stale" / LOCK_NAME).write_text('{"host": "gone", "pid": 999999}')  # left by a killed run
    data = folder / "pairs.csv"
    data.write_text("".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{i * 1.1:.1f}\tA man {i}.\tA dog {i}.\n"
                            for i in range(4)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    place, place_dooms = PLACES[case["place"]]
    address = case["address"]
    if address is not None:
        address = (address.replace("{PORT}", str(listening_ports[0])).replace("{PLAIN}", str(listening_ports[1]))
                   .replace("{CLOSED}", str(closed)))
    address_dooms = ADDRESSES[case["address"]]
    name_dooms = NAMES[case["name"]]
    run_dir = place.replace("{DIR}", str(folder))
    lines = [f"name: {case['name']}", f"run_dir: '{run_dir}'", "data:"]
    lines += [f"  {split}: {{format: stsb, path: '{data}'}}" for split in ("train", "dev", "test")]
    args, env = [], {"HOME": str(folder / "home")}
    if address is not None:
        if case["via"] == "job":
            lines.append(f"ray: {{address: '{address}'}}")
        elif case["via"] == "flag":
            args += ["--address", address]
        elif case["via"] == "override":
            args.append(f"ray.address={address}")
        else:
            env["RAY_ADDRESS"] = address
    (folder / "job.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = Path(run_dir.replace("~", str(folder / "home"), 1).replace("${name}", case["name"]))
    saved = {k: os.environ.get(k) for k in ("HOME", "RAY_ADDRESS")}
    cwd = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    FIGURES["places"]["tried"] += 1
    held = None
    if case["place"] == "held":  # a live run holds it, and has written something
        held = RunLock(folder / "held").__enter__()
        (folder / "held" / "gold").mkdir()
    try:
        os.environ.pop("RAY_ADDRESS", None)
        os.environ.update(env)
        os.chdir(folder)
        with mock.patch.object(runtime, "start_ray", side_effect=WouldStartRay), \
                mock.patch.object(cluster_address, "PROBE_TIMEOUT_S", 0.5), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(["run", str(folder / "job.yaml"), *args])
            except WouldStartRay:
                rc = None
            except BaseException:
                FIGURES["places"]["untyped"] += 1
                raise
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        if held is not None:
            held.release()
    assert "Traceback" not in out.getvalue() + err.getvalue()
    assert not (folder / "~").exists(), "a literal ~ folder"
    dooms = place_dooms or name_dooms or address_dooms
    if rc is None:
        FIGURES["places"]["accepted"] += 1
        assert not dooms, f"accepted a doomed job: {case}"
        assert (expected / "gold").is_dir() and (expected / LOCK_NAME).exists()
        return
    FIGURES["places"]["rejected" if rc == 2 else "untyped"] += 1
    assert rc == 2, (rc, err.getvalue())
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("augsbert: error: "), err.getvalue()
    assert dooms, f"refused a good job: {lines[0]}"
    named = []
    if address_dooms:
        named += [f"Ray address '{address}' (from {ADDRESS_ORIGINS[case['via']]}"]
        if case["via"] == "override":  # YAML reads the value first ("head:" is a mapping)
            named += ["key 'ray.address'"]
    if place_dooms:
        named += ["key 'run_dir'"] if case["place"] == "empty" else [f"run directory {run_dir}"]
    if name_dooms:
        named += ["key 'name'"]
    assert any(n in lines[0] for n in named), (named, lines[0])
    if case["place"] == "held" and f"run directory {run_dir}" in lines[0]:
        assert f"is in use by run {os.getpid()} on host {socket.gethostname()}" in lines[0]
    left = sorted(p.name for p in folder.iterdir())
    assert left == sorted(["afile", "existing", "stale", "pairs.csv", "job.yaml"] + (["held"] if held else [])), left
    assert not list((folder / "existing").iterdir())


# ----------------------------------------------------------------------------------------
# Whole `augsbert label` and `augsbert bench` invocations, and the Python API
# ----------------------------------------------------------------------------------------
# Each `augsbert label` below gets pair files, a model, options and an output folder, each
# good or wrong; each `augsbert bench` its parts, output folder, data folder, address and
# model. Run through the CLI in-process up to the point where Ray would start, each reaches it
# or is refused within HANG_S seconds with exit status 2 and one `augsbert: error:` line
# naming a file, the option or the address, leaving the output folder as it was (a labelling
# that reached Ray and committed nothing leaves none either). The Python API's functions get
# arguments of wrong types: each is refused with an ArgumentTypeError naming the argument, or
# reaches Ray.

FIGURES["label"] = collections.Counter()
FIGURES["bench"] = collections.Counter()
FIGURES["api"] = collections.Counter()

# pair file kinds -> whether they doom the labelling
PAIR_KINDS = {
    "csv": False, "tsv": False, "jsonl": False, "parquet": False, "mixed_jsonl": True, "repeated_header": True,
    "header_only": True, "gzip_name": True, "gzip_inside": True, "other_columns": True, "empty_sentence": True,
    "missing": True, "unknown_extension": True, "score_taken": True,
}
LABEL_MODELS = {"embedded": False, "folder": False, "pickled": True, "missing_path": True}
# options -> whether they doom it ({GPU}: a GPU asked for, which dooms where this machine has none)
LABEL_OPTIONS = {
    (): False, ("--max-length", "64"): False, ("--max-length", "100000"): "positions", ("--max-length", "8"): True,
    ("--num-gpus", "1"): "{GPU}", ("--block-size", "-1"): True, ("--actors", "0"): True,
    ("--columns", "sentence1:q"): True, ("--columns", "label=x"): True, ("--address", "127.0.0.1:{CLOSED}"): True,
    ("--address", "nonsense"): True, ("--fresh",): False, ("--format", "csv"): False,
}
# output folders -> whether they doom it
LABEL_OUTS = {"new": False, "nested_new": False, "inside_input": False, "input_folder": True, "file": True,
              "proc": True, "held": True, "foreign": True, "uri": True}


def _pair_rows(n: int) -> list[tuple[str, str, str]]:
    return [(f"k{i}", f"A man is playing {i}.", f"A woman is eating {i}.") for i in range(n)]


def _pair_file(folder, kind: str, n: int) -> str:
    """A pair file of ``kind`` in ``folder`` (columns key, sentence1, sentence2); returns its path."""
    import gzip

    rows = _pair_rows(n)
    names = ["key", "sentence1", "sentence2"]
    if kind in ("csv", "tsv", "repeated_header", "header_only", "gzip_name", "gzip_inside", "other_columns",
                "empty_sentence", "score_taken", "unknown_extension"):
        sep = "\t" if kind == "tsv" else ","
        head = {"repeated_header": ["key", "sentence1", "sentence2", "key"], "other_columns": ["id", *names[1:]],
                "score_taken": ["score", *names[1:]]}.get(kind, names)
        body = [] if kind == "header_only" else [list(r) + (["x"] if kind == "repeated_header" else []) for r in rows]
        if kind == "empty_sentence":
            body[-1][2] = " "
        text = "".join(sep.join(r) + "\n" for r in [head, *body])
        ext = {"tsv": "tsv", "gzip_name": "csv.gz", "unknown_extension": "txt"}.get(kind, "csv")
        path = folder / f"pairs-{kind}.{ext}"
        data = text.encode()
        path.write_bytes(gzip.compress(data) if kind.startswith("gzip") else data)
        if kind == "other_columns":  # beside a file of the usual columns
            (folder / "pairs-a.csv").write_text("".join(",".join(r) + "\n" for r in [names, *rows]))
            return str(folder)
        return str(path)
    if kind in ("jsonl", "mixed_jsonl"):
        lines = [dict(zip(names, r), n=i) for i, r in enumerate(rows)]
        if kind == "mixed_jsonl":
            lines[-1]["n"] = "many"
        path = folder / "pairs.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return str(path)
    if kind == "parquet":
        path = folder / "pairs.parquet"
        pq.write_table(pa.table({k: [r[j] for r in rows] for j, k in enumerate(names)}), path)
        return str(path)
    return str(folder / "no-such-pairs.csv")  # missing


@st.composite
def label_cases(draw) -> dict:
    clean = _rarely(draw, 3)
    return {"pairs": "csv" if clean else draw(st.sampled_from(list(PAIR_KINDS))),
            "rows": draw(st.integers(1, 5)),
            "model": "embedded" if clean else draw(st.sampled_from(list(LABEL_MODELS))),
            "options": () if clean else draw(st.sampled_from(list(LABEL_OPTIONS))),
            "out": "new" if clean else draw(st.sampled_from(list(LABEL_OUTS)))}


def _quiet_cli(args: list[str], suite: str):
    """Runs the CLI in-process until Ray would start: (rc or None, stdout, stderr, seconds)."""
    import time
    from unittest import mock

    from augsbert_ray import runtime
    from augsbert_ray.cli import main
    from augsbert_ray.preflight import resource_checks

    out, err = io.StringIO(), io.StringIO()
    FIGURES[suite]["tried"] += 1
    t0 = time.perf_counter()
    # another test file's Ray, left in this process, is not the command's: it would start its own
    with mock.patch.object(runtime, "start_ray", side_effect=WouldStartRay), \
            mock.patch.object(resource_checks, "joined_ray", return_value=False), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except WouldStartRay:
            rc = None
        except BaseException:
            FIGURES[suite]["untyped"] += 1
            raise
    seconds = time.perf_counter() - t0
    FIGURES[suite]["hangs"] += seconds > HANG_S
    assert seconds <= HANG_S, f"{seconds:.0f} s for {args}"
    assert "Traceback" not in out.getvalue() + err.getvalue()
    return rc, out.getvalue(), err.getvalue()


def _one_error_line(suite: str, rc, err: str) -> str:
    FIGURES[suite]["rejected" if rc == 2 else "untyped"] += 1
    assert rc == 2, (rc, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("augsbert: error: "), err
    return lines[0]


def _snapshot(folder) -> dict:
    from pathlib import Path

    return {str(p.relative_to(folder)): p.stat().st_size for p in Path(folder).rglob("*")} if os.path.isdir(folder) \
        else {}


CLEAN_LABEL = {"pairs": "csv", "rows": 3, "model": "embedded", "options": (), "out": "new"}


@_counted("label", "both")
@_fuzz(40)
@given(case=label_cases())
@example(case=CLEAN_LABEL)  # each run accepts one at least (the figures check that both outcomes occur)
@example(case={**CLEAN_LABEL, "pairs": "mixed_jsonl"})
def test_label_invocations_fail_in_one_line_or_reach_ray(workdir, listening_ports, case):
    import socket
    import tempfile
    from pathlib import Path

    from augsbert_ray.preflight.resource_checks import gpu_visible
    from augsbert_ray.run_lock import RunLock

    folder = Path(tempfile.mkdtemp(dir=workdir, prefix="label-"))
    _model_folders(folder / "models")
    inputs = folder / "in"
    inputs.mkdir()
    pairs = _pair_file(inputs, case["pairs"], case["rows"])
    model = MODEL_PATHS[case["model"]].replace("{DIR}", str(folder))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    options = [o.replace("{CLOSED}", str(closed)) for o in case["options"]]
    out = {"new": folder / "scored", "nested_new": folder / "a" / "b" / "scored", "inside_input": inputs / "scored",
           "input_folder": inputs, "file": folder / "afile", "proc": Path("/proc/augsbert/scored"),
           "held": folder / "held", "foreign": folder / "foreign", "uri": "s3://bucket/scored"}[case["out"]]
    (folder / "afile").write_text("not a folder")
    (folder / "foreign").mkdir()
    (folder / "foreign" / "notes.txt").write_text("a user's file")
    held = RunLock(folder / "held").__enter__() if case["out"] == "held" else None
    pairs_doom = PAIR_KINDS[case["pairs"]]
    if case["options"] == ("--format", "csv"):  # every file read as CSV
        pairs_doom = {"jsonl": True, "parquet": True, "tsv": True, "unknown_extension": False}.get(case["pairs"],
                                                                                                  pairs_doom)
    dooms = [pairs_doom, LABEL_MODELS[case["model"]], LABEL_OUTS[case["out"]]]
    doom = LABEL_OPTIONS[case["options"]]
    dooms.append({"positions": case["model"] == "embedded", "{GPU}": not gpu_visible()}.get(doom, doom))
    before = {p: _snapshot(p) for p in (folder / "held", folder / "foreign", inputs)}
    try:
        rc, _, err = _quiet_cli(["label", model, pairs, "--out", str(out), *options], "label")
        after = {p: _snapshot(p) for p in before}
    finally:
        if held is not None:
            held.release()
    assert not (folder / "scored").exists() and not (folder / "a").exists(), "a labelling left its folder behind"
    assert after == before, "a labelling changed a folder it was refused"
    if rc is None:
        FIGURES["label"]["accepted"] += 1
        FIGURES["label"]["late"] += True in dooms
        assert True not in dooms, f"accepted a doomed labelling: {case}"
        return
    line = _one_error_line("label", rc, err)
    assert any(d is not False for d in dooms), f"refused a good labelling: {line}"
    named = [pairs, model, str(out), "--max-length", "--num-gpus", "--block-size", "--actors", "--columns",
             "--out", "Ray address", str(inputs)]
    assert any(n in line for n in named), line
    if case["out"] == "held" and f"--out {out}" in line:
        assert f"is in use by run {os.getpid()} on host {socket.gethostname()}" in line


def _parts_doom(parts: tuple) -> bool | None:
    """Whether ``--parts`` dooms a benchmark: an unknown part, or a peer a part measures that is
    not installed here (the `bench` extra); None: no --parts (every part, each with its peer)."""
    from augsbert_ray.bench.suite import PARTS
    from augsbert_ray.preflight.optional_modules import bench_needs, installed

    if not parts:
        return None
    return any(p not in PARTS for p in parts) or not all(installed(n.module) for n in bench_needs(parts))


BENCH_PARTS = {parts: _parts_doom(parts) for parts in (("labelling",), ("bm25",), ("bm25", "semantic"),
                                                       ("gpu-melting",), ())}
BENCH_OUTS = {"new": False, "empty": False, "own": False, "file": True, "proc": True, "sys": True, "foreign": True,
              "held": True, "damaged_own": True}
BENCH_DATA = {None: False, "stsb": False, "missing": True, "no_stsb": True}
BENCH_ADDRESSES = {None: False, "127.0.0.1:{CLOSED}": True, "nonsense": True, "127.0.0.1:{PLAIN}": True}
BENCH_MODELS = {"embedded": False, "missing_path": True, "pickled": True}


@st.composite
def bench_cases(draw) -> dict:
    clean = _rarely(draw, 3)
    return {"parts": ("labelling",) if clean else draw(st.sampled_from(list(BENCH_PARTS))),
            "out": "new" if clean else draw(st.sampled_from(list(BENCH_OUTS))),
            "data": None if clean else draw(st.sampled_from(list(BENCH_DATA))),
            "address": None if clean else draw(st.sampled_from(list(BENCH_ADDRESSES))),
            "model": "embedded" if clean else draw(st.sampled_from(list(BENCH_MODELS)))}


CLEAN_BENCH = {"parts": ("bm25",), "out": "new", "data": None, "address": None, "model": "embedded"}


@_counted("bench", "both")
@_fuzz(30)
@given(case=bench_cases())
@example(case=CLEAN_BENCH)
@example(case={**CLEAN_BENCH, "out": "foreign"})
def test_bench_invocations_fail_in_one_line_or_reach_ray(workdir, listening_ports, case):
    import socket
    import tempfile
    from pathlib import Path
    from unittest import mock

    from augsbert_ray import cluster_address
    from augsbert_ray.bench.records import BenchReport
    from augsbert_ray.run_lock import RunLock

    folder = Path(tempfile.mkdtemp(dir=workdir, prefix="bench-"))
    _model_folders(folder / "models")
    for name in ("empty", "own", "foreign", "held", "damaged_own"):
        (folder / name).mkdir()
    (folder / "afile").write_text("not a folder")
    (folder / "own" / "report.json").write_text(json.dumps(BenchReport("quick", "augsbert bench", "now").to_dict()))
    (folder / "own" / "report.md").write_text("# augsbert bench (quick)\n")
    (folder / "damaged_own" / "report.json").write_text("{not json")
    (folder / "foreign" / "report.md").write_text("a user's report\n")
    (folder / "stsb" / "stsb").mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (folder / "stsb" / "stsb" / f"sts-{split}.csv").write_text("")
    (folder / "no_stsb").mkdir()
    out = {"new": folder / "bench-out", "empty": folder / "empty", "own": folder / "own", "file": folder / "afile",
           "proc": Path("/proc/augsbert/bench"), "sys": Path("/sys/augsbert-bench"), "foreign": folder / "foreign",
           "held": folder / "held", "damaged_own": folder / "damaged_own"}[case["out"]]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    args = ["bench", "--quick", "--verbose", "--out", str(out), "--model",
            MODEL_PATHS[case["model"]].replace("{DIR}", str(folder))]
    if case["parts"]:
        args += ["--parts", *case["parts"]]
    if case["data"] is not None:
        args += ["--data-dir", {"stsb": str(folder / "stsb"), "missing": str(folder / "nowhere"),
                                "no_stsb": str(folder / "no_stsb")}[case["data"]]]
    if case["address"] is not None:
        args += ["--address", case["address"].replace("{CLOSED}", str(closed))
                 .replace("{PLAIN}", str(listening_ports[1]))]
    dooms = [BENCH_PARTS[case["parts"]], BENCH_OUTS[case["out"]], BENCH_DATA[case["data"]],
             BENCH_ADDRESSES[case["address"]], BENCH_MODELS[case["model"]]]
    held = RunLock(folder / "held").__enter__() if case["out"] == "held" else None
    before = {p.name: _snapshot(p) for p in folder.iterdir() if p.is_dir() and p.name != "bench-out"}
    try:
        with mock.patch.object(cluster_address, "PROBE_TIMEOUT_S", 0.5):
            rc, _, err = _quiet_cli(args, "bench")
        after = {p.name: _snapshot(p) for p in folder.iterdir() if p.is_dir() and p.name != "bench-out"}
    finally:
        if held is not None:
            held.release()
    if rc is None:
        FIGURES["bench"]["accepted"] += 1
        FIGURES["bench"]["late"] += True in dooms
        assert True not in dooms, f"accepted a doomed benchmark: {case}"
        assert (out / "report.json").is_file()
        return
    line = _one_error_line("bench", rc, err)
    assert any(d is not False for d in dooms), f"refused a good benchmark: {line}"
    assert any(n in line for n in ("--parts", "--out", "--data-dir", "Ray address", "--model", str(folder / "models"),
                                   "./no/such/model")), line
    assert after == before and not (folder / "bench-out").exists(), "a refused benchmark wrote something"


# The API's functions, their arguments and a good value of each (None: the default is used).
API_CALLS = {
    "load_job": ["path", "overrides"],
    "run": ["job", "fresh", "verbose", "address", "until"],
    "label": ["model", "pairs", "out", "columns", "format", "score_column", "max_length", "precision",
              "token_budget", "num_gpus", "actors", "block_size", "address", "fresh", "verbose"],
    "bench": ["out", "quick", "model", "parts", "address", "data_dir", "verbose", "log", "command"],
}
WRONG_VALUES = [1, 2.5, True, None, b"x", ["a", 1], {"a": 1}, object(), "", ("seed=3",)]


@_counted("api", "both")
@_fuzz(60)
@given(function=st.sampled_from(list(API_CALLS)), argument=st.integers(0, 99), value=st.sampled_from(WRONG_VALUES))
@example(function="label", argument=3, value=None)  # columns=None: the default, accepted
@example(function="run", argument=1, value=1)  # fresh=1: refused
def test_the_python_api_refuses_wrong_argument_types_naming_them(workdir, function, argument, value):
    import tempfile
    import time
    from pathlib import Path
    from unittest import mock

    import augsbert_ray
    from augsbert_ray import runtime
    from augsbert_ray.errors import AugSBERTError

    folder = Path(tempfile.mkdtemp(dir=workdir, prefix="api-"))
    pairs = folder / "pairs.csv"
    pairs.write_text("sentence1,sentence2\nA man.,A dog.\n")
    stsb = folder / "data.csv"
    stsb.write_text("".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{i * 1.1:.1f}\tA man {i}.\tA dog {i}.\n"
                            for i in range(4)))
    job = folder / "job.yaml"
    job.write_text(f"name: api\nrun_dir: '{folder}/run'\ndata:\n"
                   + "".join(f"  {s}: {{format: stsb, path: '{stsb}'}}\n" for s in ("train", "dev", "test")))
    good = {"load_job": {"path": str(job)}, "run": {"job": str(job)},
            "label": {"model": "embedded", "pairs": str(pairs), "out": str(folder / "scored")},
            "bench": {"out": str(folder / "bench"), "parts": ["bm25"], "verbose": True, "log": lambda line: None}}
    name = API_CALLS[function][argument % len(API_CALLS[function])]
    kwargs = {**good[function], name: value}
    FIGURES["api"]["tried"] += 1
    t0 = time.perf_counter()
    with mock.patch.object(runtime, "start_ray", side_effect=WouldStartRay), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            getattr(augsbert_ray, function)(**kwargs)
            outcome = None
        except WouldStartRay:
            outcome = None
        except (AugSBERTError, TypeError) as e:
            outcome = e
        except BaseException:
            FIGURES["api"]["untyped"] += 1
            raise
    FIGURES["api"]["hangs"] += time.perf_counter() - t0 > HANG_S
    if outcome is None:
        FIGURES["api"]["accepted"] += 1
        return
    FIGURES["api"]["rejected"] += 1
    assert isinstance(outcome, AugSBERTError), f"{function}({name}={value!r}): {type(outcome).__name__}: {outcome}"
    if isinstance(outcome, TypeError):  # an ArgumentTypeError names the function and the argument
        assert f"augsbert_ray.{function}: argument {name!r}" in str(outcome), str(outcome)


def test_a_string_of_overrides_is_one_override_not_its_characters(tmp_path):
    import augsbert_ray
    from augsbert_ray.errors import ArgumentTypeError

    data = tmp_path / "data.csv"
    data.write_text("main-captions\tMSRvid\t2012test\t0000\t1.0\tA man.\tA dog.\n")
    job = tmp_path / "job.yaml"
    job.write_text("name: api\ndata:\n" + "".join(f"  {s}: {{format: stsb, path: '{data}'}}\n"
                                                  for s in ("train", "dev", "test")))
    assert augsbert_ray.load_job(job, "seed=3").seed == 3
    assert augsbert_ray.load_job(str(job), ("seed=4", "sampling.top_k=2")).seed == 4
    with pytest.raises(ArgumentTypeError, match=r"argument 'overrides' takes key.sub=value strings; item 1 is int"):
        augsbert_ray.load_job(job, ["seed=3", 5])


# ----------------------------------------------------------------------------------------
# The figures, printed once the module's tests have run (whatever their order)
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _fuzz_figures(request):
    """Prints each suite's figures after the module's tests (each test checks its own: ``_counted``)."""
    yield
    lines = ["", "fuzz figures (inputs tried / accepted / refused in one typed line / tracebacks / hangs over "
             f"{HANG_S} s / doomed inputs that would have started Ray):"]
    timed = {"run": "late", "preflight": "late", "report": "", "label": "late", "bench": "late", "api": ""}  # suites that time each input (and count late ones)
    for suite, f in FIGURES.items():
        if f["tried"]:
            lines.append(f"  {suite:9s} tried {f['tried']:5d}  accepted {f['accepted']:5d}  refused {f['rejected']:5d}  "
                         f"tracebacks {f['untyped'] + f['tracebacks']}"
                         + (f"  hangs {f['hangs']}" if suite in timed else "")
                         + (f"  late {f['late']}" if timed.get(suite) else "")
                         + (f"  (duplicate pairs kept: {f['duplicate pairs kept']})" if suite == "loaders" else ""))
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n".join(lines))
