"""Target corpus ingestion (domain adaptation, corpus mode): streaming byte ranges, cleaning
with counts, deduplication, errors naming file, line and field, and bounded driver memory."""

from __future__ import annotations

import json
import random
import threading
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_sentence

from augsbert_ray import schema
from augsbert_ray.config import CorpusConfig, ConfigError, validate_tree
from augsbert_ray.errors import DataError
from augsbert_ray.loaders import corpus


def _expected(lines: list[str | None], max_chars: int = 1000, long_lines: str = "truncate") -> tuple[list, dict]:
    """What reading should give: distinct cleaned sentences in order, and the status counts."""
    seen, counts = {}, {}
    for line in lines:
        text, status = corpus.clean(line, max_chars, long_lines)
        counts[status] = counts.get(status, 0) + 1
        if text is not None:
            seen.setdefault(text)
    return list(seen), counts


def _check(res, texts, counts, n_lines):
    assert res.sentences.schema == schema.SENTENCE_SCHEMA
    assert res.sentences.column(schema.TEXT).to_pylist() == texts
    assert res.sentences.column(schema.SENTENCE_ID).to_pylist() == list(range(len(texts)))
    assert res.counts["lines"] == n_lines
    for status in (corpus.OK, corpus.TRUNCATED, corpus.EMPTY, corpus.TOO_LONG, corpus.BAD):
        assert res.counts[status] == counts.get(status, 0), status
    # Every line is accounted for.
    c = res.counts
    assert c["lines"] == c["ok"] + c["truncated"] + c["empty"] + c["too_long"] + c["bad"]
    assert c["ok"] + c["truncated"] == c["distinct"] + c["duplicates"]


def test_clean_policy():
    assert corpus.clean("  a \t b  ", 10, "truncate") == ("a b", corpus.OK)
    assert corpus.clean(" \t ", 10, "truncate") == (None, corpus.EMPTY)
    assert corpus.clean(None, 10, "truncate") == (None, corpus.EMPTY)
    assert corpus.clean("one two three", 9, "truncate") == ("one two", corpus.TRUNCATED)  # at a space
    assert corpus.clean("abcdefghijk", 5, "truncate") == ("abcde", corpus.TRUNCATED)  # no space: hard cut
    assert corpus.clean("one two three", 9, "drop") == (None, corpus.TOO_LONG)


def test_list_files(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ("d/a.txt", "d/sub/b.txt", "d/.hidden", "d/_SUCCESS", "d/c.csv"):
        (tmp_path / name).write_text("x\n")
    names = lambda files: [p.rsplit("/", 1)[-1] for p, *_ in files]  # noqa: E731
    assert names(corpus.list_files(str(tmp_path / "d"))) == ["a.txt", "c.csv", "b.txt"]
    assert names(corpus.list_files(str(tmp_path / "d" / "*.txt"))) == ["a.txt"]  # * stays in its folder
    assert names(corpus.list_files(str(tmp_path / "d" / "**" / "*.txt"))) == ["a.txt", "b.txt"]
    assert names(corpus.list_files(str(tmp_path / "d" / "a.txt"))) == ["a.txt"]
    with pytest.raises(DataError, match="no corpus files"):
        corpus.list_files(str(tmp_path / "d" / "*.parquet"))


@pytest.mark.parametrize("range_bytes", [7, 64, 1 << 20])
def test_lines_read_in_ranges_exactly_once(tmp_path, ray_local, monkeypatch, range_bytes):
    rng = random.Random(3)
    lines = [make_sentence(rng) for _ in range(120)]
    lines[5] = "   "  # whitespace only
    lines[9] = ""  # empty
    lines[17] = " ".join(make_sentence(rng) for _ in range(12))  # long: truncated
    lines[40] = lines[3]  # a repeat
    lines[41] = "  " + lines[4].replace(" ", "   ") + " "  # a repeat once whitespace is collapsed
    # CRLF and LF endings, a BOM, no newline at the end, a second file.
    a = "\ufeff" + "\r\n".join(lines[:60]) + "\r\n"
    b = "\n".join(lines[60:])
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "part-0.txt").write_text(a, encoding="utf-8", newline="")
    (tmp_path / "c" / "part-1.txt").write_text(b, encoding="utf-8", newline="")
    monkeypatch.setattr(corpus, "RANGE_BYTES", range_bytes)
    cfg = CorpusConfig(path=str(tmp_path / "c"), max_chars=200)
    res = corpus.read_corpus(cfg)
    texts, counts = _expected(lines, max_chars=200)
    _check(res, texts, counts, len(lines))
    assert counts[corpus.TRUNCATED] == 1 and counts[corpus.EMPTY] == 2 and res.counts["duplicates"] >= 2


def test_long_lines_dropped_and_a_seeded_sample(tmp_path, ray_local):
    rng = random.Random(4)
    lines = [make_sentence(rng) + f" {i}" for i in range(50)] + ["word " * 100]
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n")
    res = corpus.read_corpus(CorpusConfig(path=str(tmp_path / "c.txt"), max_chars=100, long_lines="drop"))
    texts, counts = _expected(lines, 100, "drop")
    _check(res, texts, counts, 51)
    assert res.counts[corpus.TOO_LONG] == 1
    cfg = CorpusConfig(path=str(tmp_path / "c.txt"), max_chars=100, long_lines="drop", max_sentences=20)
    a, b = corpus.read_corpus(cfg, seed=1), corpus.read_corpus(cfg, seed=1)
    assert a.sentences.equals(b.sentences) and a.sentences.num_rows == 20 and a.counts["sampled_out"] == 30
    assert set(a.sentences.column(schema.TEXT).to_pylist()) <= set(texts)


def test_invalid_utf8_names_file_and_line_or_is_counted(tmp_path, ray_local, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_bytes(b"first line\nsecond line\nthird \xff line\nfourth line\n")
    monkeypatch.setattr(corpus, "RANGE_BYTES", 16)  # the bad line is in a later range
    with pytest.raises(DataError, match=r"c\.txt:3: invalid UTF-8") as e:
        corpus.read_corpus(CorpusConfig(path=str(path)))
    assert e.value.line == 3 and e.value.path.endswith("c.txt")
    res = corpus.read_corpus(CorpusConfig(path=str(path), on_bad_lines="skip"))
    assert res.sentences.column(schema.TEXT).to_pylist() == ["first line", "second line", "fourth line"]
    assert res.counts[corpus.BAD] == 1 and res.counts["lines"] == 4


def test_jsonl_field_and_its_errors(tmp_path, ray_local):
    path = tmp_path / "c.jsonl"
    rows = [{"text": "a first sentence", "n": 1}, {"text": None}, {"text": "a second  sentence"}, {"text": "a first sentence"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    res = corpus.read_corpus(CorpusConfig(path=str(path), format="jsonl", column="text"))
    assert res.sentences.column(schema.TEXT).to_pylist() == ["a first sentence", "a second sentence"]
    assert res.counts[corpus.EMPTY] == 2 and res.counts["duplicates"] == 1 and res.counts["lines"] == 5
    path.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    with pytest.raises(DataError, match=r"c\.jsonl:2: field 'text' missing") as e:
        corpus.read_corpus(CorpusConfig(path=str(path), format="jsonl", column="text"))
    assert e.value.field == "text"
    path.write_text(json.dumps({"text": 3}) + "\n")
    with pytest.raises(DataError, match=r"c\.jsonl:1: field 'text' is int, not a string"):
        corpus.read_corpus(CorpusConfig(path=str(path), format="jsonl", column="text"))
    path.write_text("{not json\n")
    with pytest.raises(DataError, match=r"c\.jsonl:1: not a JSON object"):
        corpus.read_corpus(CorpusConfig(path=str(path), format="jsonl", column="text"))


def test_csv_and_parquet_columns(tmp_path, ray_local):
    texts = ["the first one", "the second one", "", "the first one", "3"]
    pq.write_table(pa.table({"id": list(range(5)), "body": texts}), tmp_path / "c.parquet")
    (tmp_path / "c.csv").write_text("id,body\n" + "\n".join(f'{i},"{t}"' for i, t in enumerate(texts)) + "\n")
    (tmp_path / "c.tsv").write_text("id\tbody\n" + "\n".join(f"{i}\t{t}" for i, t in enumerate(texts)) + "\n")
    for fmt in ("parquet", "csv", "tsv"):
        res = corpus.read_corpus(CorpusConfig(path=str(tmp_path / f"c.{fmt}"), format=fmt, column="body"))
        assert res.sentences.column(schema.TEXT).to_pylist() == ["the first one", "the second one", "3"], fmt
        assert res.counts[corpus.EMPTY] == 1 and res.counts["duplicates"] == 1 and res.counts["lines"] == 5
        with pytest.raises(DataError, match=rf"c\.{fmt}(:1)?: field 'text' no such column \(the file has: id, body\)"):
            corpus.read_corpus(CorpusConfig(path=str(tmp_path / f"c.{fmt}"), format=fmt, column="text"))


@pytest.mark.parametrize("flush_lines", [1, 7, 1000])
def test_distinct_keeps_first_appearances_whatever_the_flushes(flush_lines):
    rng = random.Random(6)
    pool = [make_sentence(rng) for _ in range(40)]
    batches = [[rng.choice(pool + [None]) for _ in range(rng.randint(0, 25))] for _ in range(30)]
    d = corpus.Distinct(flush_lines)
    for b in batches:
        d.add(pa.array(b, pa.large_string() if len(b) % 2 else pa.string()))
    expected = list(dict.fromkeys(t for b in batches for t in b if t is not None))
    got = d.texts()
    assert got.type == pa.string() and got.to_pylist() == expected and d.count == len(expected)


def test_the_driver_never_holds_the_corpus(tmp_path, ray_local, monkeypatch):
    # ~24 MB of lines over 2,000 distinct sentences: the driver keeps those, not the lines.
    rng = random.Random(5)
    distinct = [f"{make_sentence(rng)} number {i}" for i in range(2000)]
    path = tmp_path / "big.txt"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(500_000):
            f.write(distinct[(i * 7919) % 2000] + "\n")
    size = path.stat().st_size
    assert size > 20_000_000
    (tmp_path / "small.txt").write_text("one line\n")
    corpus.read_corpus(CorpusConfig(path=str(tmp_path / "small.txt")))  # Ray Data's lazy imports, not measured
    # The driver keeps sentences as Arrow strings, which tracemalloc does not see: Arrow's own
    # count is sampled beside it (its buffer of new lines bounded well below this corpus).
    monkeypatch.setattr(corpus, "FLUSH_LINES", 20_000)
    arrow_peak, stop = [0], threading.Event()

    def sample_arrow() -> None:
        base = pa.total_allocated_bytes()
        while not stop.wait(0.005):
            arrow_peak[0] = max(arrow_peak[0], pa.total_allocated_bytes() - base)

    watcher = threading.Thread(target=sample_arrow)
    watcher.start()
    tracemalloc.start()
    try:
        res = corpus.read_corpus(CorpusConfig(path=str(path)))
        stop.set()
        watcher.join()
        _, peak = tracemalloc.get_traced_memory()
        peak += arrow_peak[0]
        tracemalloc.reset_peak()
        # The measure sees a materialised corpus: reading the lines into a list on the driver.
        held = open(path, encoding="utf-8").read().splitlines()
        _, peak_held = tracemalloc.get_traced_memory()
        del held
    finally:
        tracemalloc.stop()
    assert res.sentences.num_rows == 2000 and res.counts["lines"] == 500_000 and res.counts["duplicates"] == 498_000
    assert peak_held > size  # the control: holding the lines costs more than the file
    print(f"corpus of {size / 1e6:.1f} MB ({res.counts['lines']:,} lines): driver peak {peak / 1e6:.1f} MB "
          f"(the lines held in a list: {peak_held / 1e6:.1f} MB)")
    assert peak < size / 5, f"driver peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB corpus"


def test_config_either_pairs_or_corpus():
    base = {"name": "x", "data": {s: {"format": "stsb", "path": f"/d/{s}.csv"} for s in ("train", "dev", "test")}}
    test = {"format": "mrpc", "path": "/t/test.txt"}
    corpus_cfg = {"path": "/t/corpus.txt"}
    cfg = validate_tree({**base, "target": {"corpus": corpus_cfg, "test": test}})
    assert cfg.target.corpus.format == "lines" and cfg.target.pairs is None
    for target in ({"test": test}, {"corpus": corpus_cfg, "pairs": {"format": "mrpc", "path": "/p"}, "test": test}):
        with pytest.raises(ConfigError, match="either target.pairs"):
            validate_tree({**base, "target": target})
    with pytest.raises(ConfigError, match="needs the name of the text column"):
        validate_tree({**base, "target": {"corpus": {"path": "/c.csv", "format": "csv"}, "test": test}})


def test_a_csv_or_tsv_row_the_reader_refuses_names_its_file_and_line(tmp_path, ray_local):
    # the rows after a quoted newline and a blank line: a row's line is not its number
    (tmp_path / "c.csv").write_bytes(b'id,body\n1,"one\nvalue"\n\n2,fine\n3,"bad \xff"\n')
    with pytest.raises(DataError, match=r"c\.csv:6: field 'body' invalid UTF-8"):
        corpus.read_corpus(CorpusConfig(path=str(tmp_path / "c.csv"), format="csv", column="body"))
    (tmp_path / "d.tsv").write_bytes(b"id\tbody\n1\tfine\n2\ttwo\tmany\n")
    with pytest.raises(DataError, match=r"d\.tsv:3: 3 fields, the header has 2"):
        corpus.read_corpus(CorpusConfig(path=str(tmp_path / "d.tsv"), format="tsv", column="body"))
