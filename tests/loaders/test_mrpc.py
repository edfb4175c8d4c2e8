"""MRPC reader: BOM, CRLF, a checked header line, tab-separated, no quoting, labels 0/1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from augsbert_ray.errors import DataError
from augsbert_ray.loaders import load_pairs
from augsbert_ray.sources import DataSource

HEADER = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n"
ROWS = (
    '1\t702876\t702977\tAmrozi accused his brother, whom he called "the witness".'
    '\tHe accused "the witness".\r\n'
    "0\t2108705\t2108831\tYucaipa owned Dominick's.\tYucaipa bought Dominick's in 1995.\r\n"
)


def _data_dir() -> Path:
    """The shared data directory: $AUGSBERT_DATA_DIR, else ``<repo>/../shared/data``."""
    default = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return Path(os.environ.get("AUGSBERT_DATA_DIR", default))


def _load(tmp_path, text: str, **kwargs):
    path = tmp_path / "msr.txt"
    path.write_bytes(text.encode("utf-8"))
    return load_pairs(DataSource(format="mrpc", path=str(path)), "train", **kwargs), str(path)


def test_reads_rows_after_the_header(tmp_path):
    result, path = _load(tmp_path, HEADER + ROWS, binary=True)
    rows = result.table.to_pylist()
    assert result.rows_read == 2 and result.skipped == []
    assert [r["label"] for r in rows] == [1.0, 0.0]
    assert [r["line"] for r in rows] == [2, 3]  # the header is line 1
    assert rows[0]["sentence1"] == 'Amrozi accused his brother, whom he called "the witness".'
    assert {r["genre"] for r in rows} == {None}


def test_a_missing_header_is_an_error_not_a_dropped_row(tmp_path):
    with pytest.raises(DataError) as info:
        _load(tmp_path, ROWS)
    assert (info.value.line, info.value.field) == (1, None)
    assert "expected header" in info.value.reason


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ("1\t-1\t-1\tI like green apples.\tI don't.", "#1 ID", "not a corpus sentence id: '-1'"),
        ("1\t12\tx\ta\tb", "#2 ID", "not a corpus sentence id: 'x'"),
        ("2\t1\t2\ta\tb", "label", "out of range [0, 1]: 2"),
        ("1\t1\t2\ta", "#2 String", "missing (row has 4 fields, needs 5)"),
        ("1\t1\t2\ta\tb\tc", None, "extra field (row has 6 fields, needs 5; a tab in a sentence?)"),
    ],
)
def test_bad_rows(tmp_path, line, field, reason):
    with pytest.raises(DataError) as info:
        _load(tmp_path, HEADER + ROWS + line + "\r\n")
    error = info.value
    where = (str(tmp_path / "msr.txt"), 4, field, reason)
    assert (error.path, error.line, error.field, error.reason) == where


@pytest.mark.data
@pytest.mark.parametrize(
    ("name", "rows", "skipped_lines"),
    # The shipped train file appends four made-up pairs with ids -1 (lines 4078-4081) to
    # the corpus's 4,076; the reader flags them rather than training on them.
    [("train", 4076, [4078, 4079, 4080, 4081]), ("test", 1725, [])],
)
def test_real_files(name, rows, skipped_lines):
    path = _data_dir() / "mrpc" / f"msr_paraphrase_{name}.txt"
    if not path.exists():
        pytest.skip(f"MRPC file not found: {path} (set AUGSBERT_DATA_DIR to the data directory)")
    source = DataSource(format="mrpc", path=str(path))
    result = load_pairs(source, name, binary=True, on_bad_rows="skip")
    assert result.table.num_rows == rows
    assert [s.line for s in result.skipped] == skipped_lines
    assert {s.field for s in result.skipped} <= {"#1 ID"}
    # Every physical line is the header, a row or a skipped row.
    n_lines = path.read_bytes().count(b"\n")
    assert result.rows_read == n_lines - 1 == rows + len(skipped_lines)
    assert set(result.table.column("label").to_pylist()) == {0.0, 1.0}
    if skipped_lines:
        with pytest.raises(DataError) as info:
            load_pairs(source, name)
        assert (info.value.line, info.value.field) == (skipped_lines[0], "#1 ID")
