"""STSb reader: the original tab-separated files, no header, no quoting, scores 0-5."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from augsbert_ray.errors import DataError
from augsbert_ray.loaders import load_pairs
from augsbert_ray.schema import PAIR_SCHEMA
from augsbert_ray.sources import DataSource

NEWS_SOURCE = "\tEurope Media Monitor (http://emm.newsbrief.eu)" * 2  # the two extra fields
GOOD = (
    "main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane is taking off.\tA plane takes off.\r\n"
    'main-forum\tdeft-forum\t2014\t0002\t2.5\t"Quoted" start\t  end "unbalanced  \r\n'
    "main-news\theadlines\t2015\t0003\t0.000\tNews one.\tNews two." + NEWS_SOURCE + "\r\n"
)


def _data_dir() -> Path:
    """The shared data directory: $AUGSBERT_DATA_DIR, else ``<repo>/../shared/data``."""
    default = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return Path(os.environ.get("AUGSBERT_DATA_DIR", default))


def _load(tmp_path, text: bytes | str, **kwargs):
    path = tmp_path / "sts.csv"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return load_pairs(DataSource(format="stsb", path=str(path)), "train", **kwargs), str(path)


def test_reads_rows_in_order_with_scaled_labels_and_verbatim_genre(tmp_path):
    result, path = _load(tmp_path, GOOD)
    assert result.table.schema == PAIR_SCHEMA
    assert result.rows_read == 3 and result.skipped == []
    rows = result.table.to_pylist()
    assert [r["label"] for r in rows] == [1.0, 0.5, 0.0]
    assert [r["genre"] for r in rows] == ["main-captions", "main-forum", "main-news"]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert rows[1]["sentence1"] == '"Quoted" start'  # quotes are text, not csv quoting
    assert rows[1]["sentence2"] == 'end "unbalanced'  # stripped
    assert {r["split"] for r in rows} == {"train"} and {r["source"] for r in rows} == {path}


def test_nine_field_line_keeps_the_first_seven(tmp_path):
    result, _ = _load(tmp_path, GOOD.splitlines()[2] + "\n")
    assert result.table.to_pylist()[0]["sentence2"] == "News two."


def test_lf_endings_and_missing_final_newline(tmp_path):
    result, _ = _load(tmp_path, GOOD.replace("\r\n", "\n").rstrip("\n"))
    assert result.table.num_rows == 3


def _error(tmp_path, bad_line: bytes) -> DataError:
    with pytest.raises(DataError) as info:
        _load(tmp_path, GOOD.encode() + bad_line + b"\n")
    return info.value


@pytest.mark.parametrize(
    ("bad_line", "field", "reason"),
    [
        (b"main-news\theadlines\t2015\t0004", "score", "missing (row has 4 fields, needs 7)"),
        (b"g\tf\ty\t4\tabc\ta\tb", "label", "not a number: 'abc'"),
        (b"g\tf\ty\t4\t7.2\ta\tb", "label", "out of range [0, 5]: 7.2"),
        (b"g\tf\ty\t4\t-0.1\ta\tb", "label", "out of range [0, 5]: -0.1"),
        (b"g\tf\ty\t4\tnan\ta\tb", "label", "not a finite number: 'nan'"),
        (b"g\tf\ty\t4\tinf\ta\tb", "label", "not a finite number: 'inf'"),
        (b"g\tf\ty\t4\t1.0\ta\t   ", "sentence2", "empty sentence"),
        (b"g\tf\ty\t4\t1.0\t\tb", "sentence1", "empty sentence"),
        (b"g\tf\ty\t4\t1.0\ta \xff b\tb", None, "invalid UTF-8 (byte 0xff at offset 14)"),
    ],
)
def test_bad_row_names_path_line_and_field(tmp_path, bad_line, field, reason):
    error = _error(tmp_path, bad_line)
    where = (str(tmp_path / "sts.csv"), 4, field, reason)
    assert (error.path, error.line, error.field, error.reason) == where


def test_skip_mode_keeps_good_rows_and_lists_bad_ones(tmp_path):
    text = GOOD.encode() + b"g\tf\ty\t4\tabc\ta\tb\n" + b"short\n" + b"g\tf\ty\t5\t4\tc\td\n"
    result, path = _load(tmp_path, text, on_bad_rows="skip")
    assert result.rows_read == 6 and result.table.num_rows == 4
    skipped = [(s.path, s.line, s.field) for s in result.skipped]
    assert skipped == [(path, 4, "label"), (path, 5, "file")]
    assert result.table.column("line").to_pylist() == [1, 2, 3, 6]


def test_duplicate_pairs_are_kept(tmp_path):
    line = GOOD.splitlines(keepends=True)[0]
    result, _ = _load(tmp_path, line * 2)
    assert result.table.num_rows == 2


@pytest.mark.data
@pytest.mark.parametrize(("name", "rows"), [("train", 5749), ("dev", 1500), ("test", 1379)])
def test_real_files(name, rows):
    path = _data_dir() / "stsb" / f"sts-{name}.csv"
    if not path.exists():
        pytest.skip(f"STSb file not found: {path} (set AUGSBERT_DATA_DIR to the data directory)")
    result = load_pairs(DataSource(format="stsb", path=str(path)), name)
    assert result.table.num_rows == result.rows_read == rows
    assert result.skipped == []
    labels = result.table.column("label").to_pylist()
    assert all(0.0 <= x <= 1.0 and math.isfinite(x) for x in labels)
    assert min(labels) == 0.0 and max(labels) == 1.0
    # Every physical line is a row: nothing dropped between line 1 and the last line.
    assert result.table.column("line").to_pylist() == list(range(1, rows + 1))


def test_genre_selection_counts_what_it_leaves_out(tmp_path):
    from augsbert_ray.sources import DataSource

    lines = [
        "main-captions\tMSRvid\t2012test\t0001\t5.0\tA man plays.\tA man is playing.",
        "main-news\theadlines\t2013\t0002\t1.0\tStocks fell.\tRain is due.\tReuters\tx",
        "main-forum\tdeft-forum\t2014\t0003\t2.0\tI think so.\tMaybe not.",
        "main-forums\tdeft-forum\t2014\t0004\t3.0\tYes it is.\tIt is.",
        "main-captions\timages\t2014\t0005\t0.5\tA cat sits.\tA dog runs.",
    ]
    path = tmp_path / "sts.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = load_pairs(DataSource(format="stsb", path=str(path), genres=["forums"]), "train")
    assert res.table.column("genre").to_pylist() == ["main-forum", "main-forums"]  # both spellings
    assert (res.rows_read, res.filtered, len(res.skipped)) == (5, 3, 0)
    res = load_pairs(DataSource(format="stsb", path=str(path), genres=["main-captions", "News"]), "test")
    assert res.table.column("sentence1").to_pylist() == ["A man plays.", "Stocks fell.", "A cat sits."]
    assert res.filtered == 2
    with pytest.raises(ValueError, match="at least one genre"):
        DataSource(format="stsb", path=str(path), genres=[])
    csv = tmp_path / "pairs.csv"
    csv.write_text("sentence1,sentence2,label\na,b,0.5\n", encoding="utf-8")
    with pytest.raises(DataError, match="no genre column"):
        load_pairs(DataSource(format="csv", path=str(csv), genres=["news"]), "train")


@pytest.mark.data
@pytest.mark.parametrize(("name", "counts"), [("train", {"captions": 2000, "news": 3299, "forum": 450}),
                                              ("test", {"captions": 625, "news": 500, "forums": 254})])
def test_real_files_by_genre(name, counts):
    path = _data_dir() / "stsb" / f"sts-{name}.csv"
    if not path.exists():
        pytest.skip(f"STSb file not found: {path} (set AUGSBERT_DATA_DIR to the data directory)")
    total = sum(counts.values())
    for genre, n in counts.items():
        result = load_pairs(DataSource(format="stsb", path=str(path), genres=[genre]), name)
        assert result.table.num_rows == n and result.filtered == total - n and result.rows_read == total
