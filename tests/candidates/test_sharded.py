"""A large corpus deduplicated and sampled on shards: the same sentences, ids and pairs as the
single process (the driver's, or ``off_driver``'s task), whatever the number of byte ranges, hash shards, id buckets
and query blocks."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_sentence

from augsbert_ray import schema
from augsbert_ray.candidates import corpus_shards, off_driver, sharded
from augsbert_ray.config import CorpusConfig, SamplingConfig
from augsbert_ray.errors import AugSBERTError, DataError
from augsbert_ray.loaders import corpus as loader
from augsbert_ray.stages import candidates as stage
from test_off_driver import _env, _NoInputs

# corpus bytes per read task and per hash shard, sentences per query block
CUTS = {"small": (2048, 2048, 50), "large": (8192, 4096, 1000)}


def _corpus(path: Path, n: int = 400) -> Path:
    rng = random.Random(5)
    lines = [f"{make_sentence(rng)[:-1]} number {rng.randint(0, n // 3)}." for _ in range(n)]
    lines[3] = "  "  # empty
    lines[9] = lines[200] = lines[333]  # repeats of one line, the first one late
    lines[50] = "x " * 300  # too long: truncated
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _outputs(params, out: Path, caplog, monkeypatch, cuts: str | None):
    """The stage's result and two files: on the driver (``cuts`` None; what the single task writes too,
    test_off_driver.py) or sharded."""
    monkeypatch.setattr(off_driver, "OFF_DRIVER_BYTES", off_driver.OFF_DRIVER_BYTES if cuts is None else 0)
    monkeypatch.setattr(sharded, "ENABLED", cuts is not None)
    if cuts is not None:
        monkeypatch.setattr(loader, "RANGE_BYTES", CUTS[cuts][0])
        monkeypatch.setattr(corpus_shards, "SHARD_BYTES", CUTS[cuts][1])
        monkeypatch.setattr(corpus_shards, "QUERY_BLOCK", CUTS[cuts][2])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="augsbert_ray"):
        result = stage._corpus_run(_NoInputs(), params, _env(out))
    line = next(r.getMessage() for r in caplog.records if "corpus sentences" in r.getMessage())
    assert ("sentence parts" in line) == (cuts is not None), line
    return result, pq.read_table(out / "sentences.parquet"), pq.read_table(out / "candidates.parquet")


def _same(a: pa.Table, b: pa.Table) -> bool:
    """Equal tables, NaN scores (random pairs have none) equal to each other."""
    score = schema.RETRIEVAL_SCORE
    return (a.drop_columns([score]).equals(b.drop_columns([score]))
            and np.array_equal(a.column(score).to_numpy(), b.column(score).to_numpy(), equal_nan=True))


def test_bm25_on_shards_finds_the_single_process_pairs(tmp_path, ray_local, monkeypatch, caplog):
    path = _corpus(tmp_path / "corpus.txt")
    sampling = SamplingConfig(strategy="bm25", top_k=3, query_batch_size=16)
    params = stage.CandidatesParams(source="target corpus", seed=3, sampling=sampling,
                                    corpus=CorpusConfig(path=str(path), max_chars=200))
    single = _outputs(params, tmp_path / "single", caplog, monkeypatch, None)
    result, sentences, candidates = _outputs(params, tmp_path / "sharded", caplog, monkeypatch, "small")
    assert result.model_dump() == single[0].model_dump()
    assert sentences.equals(single[1]) and _same(candidates, single[2])
    c = result.corpus_lines
    assert c["empty"] == 1 and c["truncated"] == 1 and c["duplicates"] >= 2 and result.candidates > result.sentences
    sentence_parts = sorted((tmp_path / "sharded" / "sentences.parts").glob("part-*.parquet"))
    pair_parts = sorted((tmp_path / "sharded" / "candidates.parts").glob("part-*.parquet"))
    assert len(pair_parts) == len(sentence_parts) > 5
    assert not (tmp_path / "sharded" / "_shards").exists() and not (tmp_path / "sharded" / "_hits").exists()


def test_random_pairs_on_shards_do_not_depend_on_the_cuts(tmp_path, ray_local, monkeypatch, caplog):
    path = _corpus(tmp_path / "corpus.txt")
    params = stage.CandidatesParams(source="target corpus", seed=4, sampling=SamplingConfig(strategy="rs"),
                                    corpus=CorpusConfig(path=str(path), max_sentences=300))
    single = _outputs(params, tmp_path / "single", caplog, monkeypatch, None)
    assert single[0].corpus_lines["sampled_out"] > 0
    for cuts in CUTS:
        result, sentences, candidates = _outputs(params, tmp_path / cuts, caplog, monkeypatch, cuts)
        assert result.model_dump() == single[0].model_dump(), cuts
        assert sentences.equals(single[1]) and _same(candidates, single[2]), cuts


def test_a_bad_line_on_shards_is_the_first_in_the_corpus(tmp_path, ray_local, monkeypatch):
    path = _corpus(tmp_path / "corpus.txt")
    raw = path.read_bytes().split(b"\n")
    raw[150], raw[30] = b"bad \xff byte", b"another \xfe"  # in different byte ranges, the second first
    path.write_bytes(b"\n".join(raw))
    cfg = CorpusConfig(path=str(path))
    with pytest.raises(DataError) as on_driver:
        loader.read_corpus(cfg)
    monkeypatch.setattr(loader, "RANGE_BYTES", 4096)
    with pytest.raises(DataError) as on_shards:
        corpus_shards.shard_corpus(cfg, loader.list_files(str(path)), tmp_path / "out")
    assert str(on_shards.value) == str(on_driver.value) and "31" in str(on_driver.value)


def test_files_a_reader_does_not_find_stop_the_stage(tmp_path):
    written = [{corpus_shards.WRITTEN: "[0, 1]"}, {corpus_shards.WRITTEN: "[1]"}]
    expected = corpus_shards.expected_files(written, 2)
    assert expected == [1, 2]
    corpus_shards.check_found([{"index": 0, "found": 1}, {"index": 1, "found": 2}], expected, tmp_path)
    with pytest.raises(AugSBERTError, match="1 of 3 files .* shared file system"):
        corpus_shards.check_found([{"index": 0, "found": 1}, {"index": 1, "found": 1}], expected, tmp_path)


def test_a_staged_run_directory_keeps_a_cluster_on_the_single_task():
    from types import SimpleNamespace

    def env(nodes, storage):
        return SimpleNamespace(cluster=SimpleNamespace(nodes=nodes), storage=storage)

    assert stage._shared_folder(env(1, "s3://bucket/runs/a/stages/candidates"))
    assert stage._shared_folder(env(3, "/mnt/augsbert/runs/a/stages/candidates"))
    assert not stage._shared_folder(env(3, "s3://bucket/runs/a/stages/candidates"))


def _table_corpus(folder: Path, fmt: str, n: int = 300) -> str:
    """The lines of ``_corpus`` in two files of ``fmt`` (column ``body``), with what each format
    must get right: CSV quoted commas, quotes and newlines; a TSV BOM, CRLF endings, a blank line
    and literal quotes; Parquet nulls and several row groups. A glob over the files."""
    rng = random.Random(8)
    texts = [f"{make_sentence(rng)[:-1]} number {rng.randint(0, n // 3)}." for _ in range(n)]
    texts[3], texts[9], texts[50] = "  ", texts[200], "x " * 300  # empty, a repeat, too long
    texts[20], texts[21] = 'a "quoted", comma-held\nsentence', "two\r\nlines"  # CSV quoting; TSV: no newline
    folder.mkdir(parents=True)
    for k, chunk in enumerate((texts[: n // 2], texts[n // 2:])):
        path = folder / f"part-{k}.{fmt}"
        if fmt == "parquet":
            values = [None if t.strip() == "" else t for t in chunk]
            pq.write_table(pa.table({"id": list(range(len(chunk))), "body": values}), path, row_group_size=40)
        elif fmt == "csv":
            import csv

            with open(path, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(["id", "body"])
                w.writerows(enumerate(chunk))
        else:
            rows = [f"{i}\t{t.replace(chr(13), ' ').replace(chr(10), ' ')}" for i, t in enumerate(chunk)]
            rows.insert(7, "")  # a blank line: the reader skips it
            path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(["id\tbody", *rows]).encode() + b"\r\n")
    return str(folder / f"*.{fmt}")


def test_csv_tsv_and_parquet_on_shards_find_the_single_process_pairs(tmp_path, ray_local, monkeypatch, caplog):
    # The single process reads the three formats alike (tests/test_corpus.py); its pairs over the
    # CSV files are the reference for each format's sentence parts and the pairs sampled on them
    # (the stage around them: the tests above). Random pairs: the cheapest sampler (BM25 on
    # parts: above, and on a cluster in tests/cluster/).
    globs = {fmt: _table_corpus(tmp_path / fmt, fmt) for fmt in ("csv", "tsv", "parquet")}

    def params(fmt: str) -> stage.CandidatesParams:
        return stage.CandidatesParams(
            source="target corpus", seed=5, sampling=SamplingConfig(strategy="rs", random_per_sentence=2),
            corpus=CorpusConfig(path=globs[fmt], format=fmt, column="body", max_chars=200))

    single, sentences, candidates = _outputs(params("csv"), tmp_path / "single", caplog, monkeypatch, None)
    c = single.corpus_lines
    assert c["lines"] == 300 and c["empty"] == 1 and c["truncated"] == 1 and c["duplicates"] >= 1
    assert 'a "quoted", comma-held sentence' in sentences.column(schema.TEXT).to_pylist()
    monkeypatch.setattr(loader, "RANGE_BYTES", CUTS["small"][0])
    monkeypatch.setattr(corpus_shards, "SHARD_BYTES", CUTS["small"][1])
    monkeypatch.setattr(corpus_shards, "QUERY_BLOCK", CUTS["small"][2])
    for fmt, n_parts in (("csv", 2), ("tsv", 8), ("parquet", 8)):  # per file; per byte range; per row group
        out = tmp_path / f"sharded-{fmt}"
        parts = corpus_shards.shard_corpus(params(fmt).corpus, loader.list_files(globs[fmt]), out, seed=5)
        assert parts.counts == c and len(parts.parts) == n_parts, fmt
        assert pa.concat_tables([pq.read_table(p) for p in parts.parts]).equals(sentences), fmt
        ctx = stage._context(None, np.empty(0, np.int64), params(fmt), _env(out), None, hosts=None)
        assert sharded.sample_parts(ctx, parts, out) == single.candidates
        assert _same(pq.read_table(out / "candidates.parquet"), candidates), fmt


def test_a_streamed_csv_fills_consecutive_units_of_bounded_text(tmp_path):
    import csv
    import gzip

    rng = random.Random(2)
    path = tmp_path / "big.csv"
    texts = [f'{make_sentence(rng)} "{i}", and\nmore' for i in range(40_000)]  # quoted quotes, commas, newlines
    path.write_text("n,body\n" + "".join(f'{i},"{t.replace(chr(34), 2 * chr(34))}"\n' for i, t in enumerate(texts)))
    assert path.stat().st_size > 2 << 20  # several of the reader's row batches
    row = {"path": str(path), "unit": 7, "units": 10}
    units = list(corpus_shards._streamed_units(row, "csv", "body", 1000, "truncate", range_bytes=400_000))
    assert [u for u, _ in units] == list(range(7, 7 + len(units))) and 2 < len(units) <= 10
    with open(path, newline="", encoding="utf-8") as f:  # Python's own CSV reader as the reference
        whole = pa.table({"body": [r[1] for r in list(csv.reader(f))[1:]]})
    expected = loader.clean_column(whole, "body", 1000, "truncate")
    assert pa.concat_tables([t for _, t in units]).equals(expected)
    assert expected.column(schema.TEXT)[5].as_py() == " ".join(texts[5].split())
    # fewer units than the text would fill: the last one takes the rest (the next file's are not touched)
    capped = list(corpus_shards._streamed_units({**row, "units": 2}, "csv", "body", 1000, "truncate", 400_000))
    assert [u for u, _ in capped] == [7, 8] and pa.concat_tables([t for _, t in capped]).equals(expected)
    # a compressed TSV is streamed too, as Ray Data's reader decompresses it
    gz = tmp_path / "c.tsv.gz"
    rows = "".join(f"{i}\t{t.replace(chr(10), ' ')}\n" for i, t in enumerate(texts[:50]))
    gz.write_bytes(gzip.compress(f"n\tbody\n{rows}".encode()))
    cfg = CorpusConfig(path=str(tmp_path / "*.gz"), format="tsv", column="body")
    tasks, n_units = corpus_shards.read_tasks(cfg, loader.list_files(cfg.path), 1024)
    assert [t["kind"] for t in tasks] == [corpus_shards.STREAM]
    assert n_units == gz.stat().st_size * corpus_shards.COMPRESSION // 1024 + 1  # room for its text unpacked
    got = pa.concat_tables([t for _, t in corpus_shards._streamed_units(tasks[0], "tsv", "body", 1000, "truncate",
                                                                        1 << 20)])
    assert got.column(schema.TEXT).to_pylist() == [" ".join(t.split()) for t in texts[:50]]


def test_a_bad_row_on_shards_names_its_file_line_and_field(tmp_path, ray_local, monkeypatch):
    monkeypatch.setattr(loader, "RANGE_BYTES", 64)  # the TSV's bad rows in later byte ranges
    rows = [f"{i}\tsentence number {i}".encode() for i in range(30)]
    rows[17], rows[12] = b"17\tbad \xff byte", b"12\ttoo\tmany"  # the second first in the file
    tsv = tmp_path / "c.tsv"
    tsv.write_bytes(b"id\tbody\n" + b"\n".join(rows) + b"\n")
    with pytest.raises(DataError) as e:
        corpus_shards.shard_corpus(CorpusConfig(path=str(tsv), format="tsv", column="body"),
                                   loader.list_files(str(tsv)), tmp_path / "out")
    assert (e.value.path, e.value.line, e.value.field, e.value.reason) == (str(tsv), 14, None,
                                                                           "3 fields, the header has 2")

    def error(path: Path, fmt: str) -> str:  # one task's reading, in this process
        row = {"path": str(path), "size": path.stat().st_size, "start": 0, "end": path.stat().st_size, "names": "[]",
               "unit": 0, "units": 1}
        with pytest.raises(DataError) as e:
            list(corpus_shards._unit_lines({**row, "kind": corpus_shards.STREAM if fmt == "csv" else
                                            corpus_shards.RANGE}, fmt, "body", 1000, "truncate", "error", 1 << 20))
        return str(e.value)

    rows[12] = b"12\tfine"
    tsv.write_bytes(b"id\tbody\n" + b"\n".join(rows) + b"\n")
    assert error(tsv, "tsv").endswith("c.tsv:19: field 'body' invalid UTF-8")
    # CSV: a quoted newline and a blank line before the bad row, so its line is not its row's number
    (tmp_path / "c.csv").write_bytes(b'id,body\n1,"one\nvalue"\n\n2,fine\n3,"bad \xff"\n4,fine\n')
    assert error(tmp_path / "c.csv", "csv").endswith("c.csv:6: field 'body' invalid UTF-8")
    (tmp_path / "c.csv").write_bytes(b'id,body\n1,"one\nvalue"\n2,fine,extra\n')
    assert error(tmp_path / "c.csv", "csv").endswith("c.csv:4: 3 fields, the header has 2")
    pq.write_table(pa.table({"id": [1, 2], "body": ["a", "b"]}), tmp_path / "c.parquet")
    for fmt in ("csv", "tsv", "parquet"):  # as read_corpus says it (tests/test_corpus.py)
        with pytest.raises(DataError, match=rf"c\.{fmt}(:1)?: field 'text' no such column \(the file has: id, body\)"):
            corpus_shards.read_tasks(CorpusConfig(path=str(tmp_path / f"c.{fmt}"), format=fmt, column="text"),
                                     loader.list_files(str(tmp_path / f"c.{fmt}")), 64)
