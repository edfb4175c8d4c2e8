"""Generic formats (csv, tsv, jsonl, parquet, hf) read through a column map, and the registry."""

from __future__ import annotations

import json
import re
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from augsbert_ray.errors import DataError
from augsbert_ray.loaders import get_reader, load_pairs
from augsbert_ray.schema import PAIR_SCHEMA
from augsbert_ray.sources import DataSource

COLUMNS = {"sentence1": "text_a", "sentence2": "text_b", "label": "score", "genre": "domain"}
RECORDS = [
    {"id": 1, "text_a": "A man is eating.", "text_b": "A man eats.", "score": 5.0, "domain": "cap"},
    {"id": 2, "text_a": 'He said, "hi".', "text_b": "  Hello  ", "score": 2.5, "domain": "forum"},
]
EXPECTED = [
    ("A man is eating.", "A man eats.", 1.0, "cap"),
    ('He said, "hi".', "Hello", 0.5, "forum"),
]
# Rows 2-3 of a file with a header on line 1, in csv and tsv, with standard quoting.
CSV = (
    "id,text_a,text_b,score,domain\r\n"
    "1,A man is eating.,A man eats.,5,cap\r\n"
    '2,"He said, ""hi"".",  Hello  ,2.5,forum\r\n'
)
TSV = (
    "id\ttext_a\ttext_b\tscore\tdomain\n"
    "1\tA man is eating.\tA man eats.\t5\tcap\n"
    '2\t"He said, ""hi""."\t  Hello  \t2.5\tforum\n'
)
JSONL = "".join(json.dumps(r) + "\n" for r in RECORDS)


def _source(path, fmt: str, **kwargs) -> DataSource:
    return DataSource(format=fmt, path=str(path), columns=COLUMNS, label_range=(0, 5), **kwargs)


def _write(tmp_path, name: str, text: str | bytes):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _pairs(result) -> list[tuple]:
    fields = ("sentence1", "sentence2", "label", "genre")
    return [tuple(row[f] for f in fields) for row in result.table.to_pylist()]


def _lines(result) -> list[int]:
    return result.table.column("line").to_pylist()


@pytest.mark.parametrize(("fmt", "text"), [("csv", CSV), ("tsv", TSV)])
def test_delimited(tmp_path, fmt, text):
    result = load_pairs(_source(_write(tmp_path, f"p.{fmt}", text), fmt), "dev")
    assert result.table.schema == PAIR_SCHEMA
    assert _pairs(result) == EXPECTED and _lines(result) == [2, 3]
    assert set(result.table.column("split").to_pylist()) == {"dev"}


def test_csv_lines_count_quoted_newlines_and_blank_lines(tmp_path):
    path = _write(tmp_path, "p.csv", 'text_a,text_b,score\n"two\nlines",b,1\n\nc,d,0\n')
    columns = {"sentence1": "text_a", "sentence2": "text_b", "label": "score"}
    result = load_pairs(DataSource(format="csv", path=str(path), columns=columns), "train")
    assert result.rows_read == 2 and _lines(result) == [2, 5]
    assert result.table.column("genre").to_pylist() == [None, None]


def test_jsonl_skips_blank_lines_and_keeps_physical_line_numbers(tmp_path):
    text = json.dumps(RECORDS[0]) + "\n\n   \n" + json.dumps(RECORDS[1]) + "\n"
    result = load_pairs(_source(_write(tmp_path, "p.jsonl", text), "jsonl"), "train")
    assert _pairs(result) == EXPECTED and _lines(result) == [1, 4] and result.rows_read == 2


def test_parquet(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), path)
    result = load_pairs(_source(path, "parquet"), "test")
    assert _pairs(result) == EXPECTED and _lines(result) == [1, 2]


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_missing_column_in_header_is_a_file_error(tmp_path, fmt):
    path = _write(tmp_path, f"p.{fmt}", (CSV if fmt == "csv" else TSV).replace("text_b", "txt_b"))
    with pytest.raises(DataError) as info:  # even when skipping: no row could be read
        load_pairs(_source(path, fmt), "train", on_bad_rows="skip")
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 1, "text_b")


def test_missing_column_in_parquet(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"text_a": "x", "text_b": "y", "score": 1.0}]), path)
    with pytest.raises(DataError) as info:
        load_pairs(_source(path, "parquet"), "train")
    assert (info.value.path, info.value.line, info.value.field) == (str(path), None, "domain")


@pytest.mark.parametrize(
    ("fmt", "bad_line", "field", "reason"),
    [
        ("csv", b"3,x,y,abc,d", "label", "not a number: 'abc'"),
        ("csv", b"3,x,y,NaN,d", "label", "not a finite number: 'NaN'"),
        ("csv", b"3,x,y,7.2,d", "label", "out of range [0, 5]: 7.2"),
        ("csv", b"3,x, ,1,d", "sentence2", "empty sentence"),
        ("csv", b"3,x,y", "score", "missing (row has 3 fields, header has 5)"),
        ("csv", b"3,x,y,1,d,e", None, "extra field (row has 6 fields, header has 5)"),
        ("csv", b'3,x,"y"z,1,d', None, "malformed csv: ',' expected after '\"'"),
        ("csv", b"3,x,\xffy,1,d", None, "invalid UTF-8 (byte 0xff at offset 4)"),
        (
            "jsonl",
            b'{"text_a": "x", "score": 1, "domain": "d"}',
            "text_b",
            "missing (row has keys ['domain', 'score', 'text_a'])",
        ),
        (
            "jsonl",
            b'{"text_a": "x", "text_b": "y", "score": NaN}',
            "label",
            "not a finite number: nan",
        ),
        (
            "jsonl",
            b'{"text_a": "x", "text_b": null, "score": 1}',
            "sentence2",
            "not a string: None",
        ),
        ("jsonl", b'{"text_a": "x", "text_b": "y", "score": true}', "label", "not a number: True"),
        ("jsonl", b'["x", "y", 1]', None, "not a JSON object: list"),
        (
            "jsonl",
            b"{oops",
            None,
            "invalid JSON: Expecting property name enclosed in double quotes (column 2)",
        ),
        ("jsonl", b'{"text_a": "\xfe"}', None, "invalid UTF-8 (byte 0xfe at offset 12)"),
    ],
)
def test_bad_row_names_path_line_and_field(tmp_path, fmt, bad_line, field, reason):
    good = CSV if fmt == "csv" else JSONL
    path = _write(tmp_path, f"p.{fmt}", good.encode() + bad_line + b"\n")
    columns = COLUMNS if fmt == "csv" else {**COLUMNS, "genre": None}
    source = DataSource(format=fmt, path=str(path), columns=columns, label_range=(0, 5))
    with pytest.raises(DataError) as info:
        load_pairs(source, "train")
    line = 4 if fmt == "csv" else 3
    error = info.value
    assert (error.path, error.line, error.field, error.reason) == (str(path), line, field, reason)


def test_skip_mode_counts_bad_rows_and_keeps_the_good_ones(tmp_path):
    path = _write(tmp_path, "p.csv", CSV + "3,x,y,abc,d\n4,x,,1,d\n5,p,q,0,r\n")
    result = load_pairs(_source(path, "csv"), "train", on_bad_rows="skip")
    assert result.rows_read == 5 and result.table.num_rows == 3
    assert [(s.path, s.line, s.field) for s in result.skipped] == [
        (str(path), 4, "label"),
        (str(path), 5, "sentence2"),
    ]
    assert _pairs(result) == EXPECTED + [("p", "q", 0.0, "r")]


def test_binary_rejects_a_label_between_0_and_1(tmp_path):
    path = _write(tmp_path, "p.csv", "text_a,text_b,score,domain\na,b,1,x\na,b,0,x\na,b,0.5,x\n")
    source = DataSource(format="csv", path=str(path), columns=COLUMNS)
    with pytest.raises(DataError) as info:
        load_pairs(source, "train", binary=True)
    assert (info.value.line, info.value.field) == (4, "label")
    labels = load_pairs(source, "train").table.column("label").to_pylist()
    assert labels == [1.0, 0.0, 0.5]


def test_unknown_format_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown format 'xlsx'; valid formats: stsb, mrpc, csv"):
        get_reader("xlsx")


def test_bad_on_bad_rows_value(tmp_path):
    with pytest.raises(ValueError, match="on_bad_rows"):
        load_pairs(_source(_write(tmp_path, "p.csv", CSV), "csv"), "train", on_bad_rows="ignore")


def test_hf_without_datasets_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DataError, match=re.escape('pip install "augsbert-ray[hub]"')) as info:
        load_pairs(_source("org/pairs", "hf", hf_split="train"), "train")
    assert info.value.path == "org/pairs"


class _FakeDataset(list):
    """Just enough of ``datasets.Dataset`` for the hub reader."""

    @property
    def column_names(self) -> list[str]:
        return list(self[0])

    def select_columns(self, names) -> "_FakeDataset":
        return _FakeDataset({n: row[n] for n in names} for row in self)


def test_hf_reads_rows_through_the_column_map(monkeypatch):
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return _FakeDataset(RECORDS)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    result = load_pairs(_source("org/pairs", "hf", hf_config="en", hf_split="validation"), "dev")
    assert calls == [(("org/pairs", "en"), {"split": "validation"})]
    assert _pairs(result) == EXPECTED and _lines(result) == [1, 2]
    assert set(result.table.column("source").to_pylist()) == {"org/pairs"}


def _rows(n: int, start: int = 0) -> str:
    return "".join(f"A man {i}.,A dog {i}.,0.5\n" for i in range(start, start + n))


@pytest.mark.parametrize("mode", ["error", "skip"])
def test_a_quote_left_open_to_the_end_of_the_file_is_an_error_naming_the_lines_it_swallowed(tmp_path, mode):
    # Line 6 of 21 opens a quote that nothing closes: the csv reader takes lines 6-21 as one record.
    text = "sentence1,sentence2,label\n" + _rows(4) + '"A man 4.,A dog 4.,0.5\n' + _rows(15, 5)
    path = _write(tmp_path, "p.csv", text)
    with pytest.raises(DataError) as info:
        load_pairs(DataSource(format="csv", path=str(path)), "train", on_bad_rows=mode)
    assert (info.value.line, info.value.field) == (6, None)
    assert "unterminated quote: this record runs to the end of the file, swallowing lines 7-21 (15 lines)" in str(
        info.value)


@pytest.mark.parametrize("mode", ["error", "skip"])
def test_a_record_of_more_than_the_line_limit_is_an_error_in_both_modes(tmp_path, mode):
    from augsbert_ray.loaders.tabular import MAX_RECORD_LINES

    # A stray quote on line 3, closed by another on line 15: one "valid" record of 13 lines.
    text = ("sentence1,sentence2,label\n" + _rows(1) + '"A man 1.,A dog 1.,0.5\n' + _rows(11, 2)
            + 'A man 13.",A dog 13.,0.5\n' + _rows(2, 14))
    path = _write(tmp_path, "p.csv", text)
    with pytest.raises(DataError) as info:
        load_pairs(DataSource(format="csv", path=str(path)), "train", on_bad_rows=mode)
    assert info.value.line == 3 and f"one record spans lines 3-15 (13 lines, more than the {MAX_RECORD_LINES}" in str(
        info.value)


def test_a_skipped_record_of_several_lines_lists_its_span(tmp_path):
    # A stray quote on line 3 closed on line 5: one record of three lines, with a bad label.
    text = ("sentence1,sentence2,label\n" + _rows(1) + '"A man 1.,A dog 1.,0.5\n' + _rows(1, 2) + 'x",y,zz\n'
            + _rows(2, 5))
    path = _write(tmp_path, "p.csv", text)
    result = load_pairs(DataSource(format="csv", path=str(path)), "train", on_bad_rows="skip")
    assert _lines(result) == [2, 6, 7] and [s.line for s in result.skipped] == [3]
    assert result.skipped[0].reason.endswith("(one record of lines 3-5)")
    with pytest.raises(DataError, match=r"p.csv:3: field 'label' not a number: 'zz' \(one record of lines 3-5\)"):
        load_pairs(DataSource(format="csv", path=str(path)), "train")
