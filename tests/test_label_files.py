"""``augsbert label``'s inputs and output folder, without Ray: formats, column maps, globs,
the one-line errors, and the store that commits scored shards."""

from __future__ import annotations

import gzip
import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from augsbert_ray import schema
from augsbert_ray.errors import AugSBERTError, ConfigError, DataError
from augsbert_ray.labeling.pair_files import check_inputs, find_pair_files, parse_columns, shards
from augsbert_ray.labeling.output import LabelStore, check_output, open_output
from conftest import make_sentence

N = 11


def _pairs(seed=0):
    rng = random.Random(seed)
    return [(f"q{i:03d}", make_sentence(rng), make_sentence(rng), i) for i in range(N)]


def write(path, fmt, rows, names=("id", "question", "answer", "n")):
    import csv

    if fmt in ("csv", "tsv"):
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, delimiter="\t" if fmt == "tsv" else ",")
            w.writerow(names)
            w.writerows(rows)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(dict(zip(names, r))) + "\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.table({k: [r[j] for r in rows] for j, k in enumerate(names)}), path, row_group_size=4)
    return path


COLUMNS = "sentence1=question,sentence2=answer"


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "parquet"])
def test_every_format_gives_its_columns_and_the_mapped_sentences_in_order(tmp_path, fmt):
    rows = _pairs()
    path = write(tmp_path / f"pairs.{fmt}", fmt, rows)
    inputs = check_inputs(find_pair_files([str(path)]), parse_columns(COLUMNS))
    assert inputs.rows == [N] and inputs.schema.names == ["id", "question", "answer", "n", "score"]
    got = list(shards(inputs, 4))
    assert [s.rows.num_rows for s in got] == [4, 4, 3] and [s.first_row for s in got] == [0, 4, 8]
    out = pa.concat_tables([s.rows for s in got])
    cands = pa.concat_tables([s.candidates for s in got])
    assert out.column("question").to_pylist() == [r[1] for r in rows]
    assert cands.column(schema.SENTENCE1).to_pylist() == [r[1] for r in rows]
    assert cands.column(schema.SENTENCE2).to_pylist() == [r[2] for r in rows]
    assert cands.column(schema.ID2).to_pylist() == list(range(N))
    # CSV and TSV values are text; JSON lines and Parquet keep their types.
    assert out.column("n").to_pylist() == ([str(i) for i in range(N)] if fmt in ("csv", "tsv") else list(range(N)))


def test_globs_and_folders_find_every_file_once_and_shards_never_span_two(tmp_path):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    write(tmp_path / "in" / "a.csv", "csv", _pairs(1))
    # the same columns in another order
    write(tmp_path / "in" / "sub" / "b.jsonl", "jsonl", [(r[1], r[0], r[2], str(r[3])) for r in _pairs(2)[:5]],
          names=("question", "id", "answer", "n"))
    write(tmp_path / "in" / "c.parquet", "parquet", [(*r[:3], str(r[3])) for r in _pairs(3)[:3]])
    (tmp_path / "in" / "scored").mkdir()  # the output folder, inside the inputs: never read as one
    write(tmp_path / "in" / "scored" / "part-000000.parquet", "parquet", _pairs(4))
    (tmp_path / "in" / "scored" / "_label.json").write_text("{}")
    found = find_pair_files([str(tmp_path / "in" / "*.csv"), str(tmp_path / "in")], exclude=tmp_path / "in" / "scored")
    assert [f.path.split("/in/")[1] for f in found] == ["a.csv", "c.parquet", "sub/b.jsonl"]
    assert [f.format for f in found] == ["csv", "parquet", "jsonl"]
    inputs = check_inputs(found, parse_columns(COLUMNS))
    # One output schema for all, in the first file's order.
    assert inputs.rows == [N, 3, 5] and inputs.schema.names == ["id", "question", "answer", "n", "score"]
    assert inputs.schema.field("n").type == pa.string()
    got = list(shards(inputs, 4))
    assert got[-1].rows.column("n").to_pylist() == ["4"] and got[-1].rows.column("id").to_pylist() == ["q004"]
    assert [(s.candidates.column(schema.ID1)[0].as_py(), s.rows.num_rows) for s in got] == \
        [(0, 4), (0, 4), (0, 3), (1, 3), (2, 4), (2, 1)]


def test_files_at_a_storage_uri_are_read_through_pyarrow_filesystems(tmp_path):
    write(tmp_path / "a.csv", "csv", _pairs(1))
    write(tmp_path / "b.parquet", "parquet", [(*r[:3], str(r[3])) for r in _pairs(2)])
    found = find_pair_files([f"file://{tmp_path}/*.csv", f"file://{tmp_path}/b.parquet"])
    assert [f.path for f in found] == [f"file://{tmp_path}/a.csv", f"file://{tmp_path}/b.parquet"]
    inputs = check_inputs(found, parse_columns(COLUMNS))
    try:
        assert inputs.files[0].local is not None and inputs.files[1].local is None  # text files are copied
        got = pa.concat_tables([s.rows for s in shards(inputs, 8)])
        assert got.column("question").to_pylist() == [r[1] for r in _pairs(1)] + [r[1] for r in _pairs(2)]
    finally:
        inputs.close()
    assert not os.path.exists(inputs.staging)  # the copies are gone


def _error(tmp_path, case):
    """Writes the case's file and returns the error (or None) its check raises."""
    rows = _pairs()
    cols = COLUMNS
    if case == "missing file":
        paths = [str(tmp_path / "nope.csv")]
    elif case == "glob without a match":
        paths = [str(tmp_path / "*.tsv")]
    elif case == "unknown extension":
        (tmp_path / "pairs.txt").write_text("x\n")
        paths = [str(tmp_path / "pairs.txt")]
    elif case == "missing column":
        paths = [str(write(tmp_path / "p.csv", "csv", rows))]
        cols = "sentence1=question,sentence2=reply"
    elif case == "unmapped column":
        paths = [str(write(tmp_path / "p.csv", "csv", rows))]
        cols = None
    elif case == "empty sentence":
        rows[6] = (rows[6][0], "  ", rows[6][2], 6)
        paths = [str(write(tmp_path / "p.csv", "csv", rows))]
    elif case == "short csv row":
        paths = [str(write(tmp_path / "p.csv", "csv", rows))]
        with open(paths[0], "a") as f:
            f.write("q99,only a question\n")
    elif case == "jsonl number":
        rows[3] = (rows[3][0], rows[3][1], 42, 3)
        paths = [str(write(tmp_path / "p.jsonl", "jsonl", rows))]
    elif case == "parquet nulls":
        rows[5] = (rows[5][0], None, rows[5][2], 5)
        paths = [str(write(tmp_path / "p.parquet", "parquet", rows))]
    elif case == "parquet integers":
        paths = [str(write(tmp_path / "p.parquet", "parquet", [(r[0], r[3], r[2], r[3]) for r in rows]))]
    elif case == "score column taken":
        paths = [str(write(tmp_path / "p.csv", "csv", rows, names=("id", "question", "answer", "score")))]
    elif case == "columns of two types":
        paths = [str(write(tmp_path / "a.csv", "csv", rows)), str(write(tmp_path / "b.parquet", "parquet", rows))]
    elif case == "jsonl column of mixed types":
        rows[7] = (*rows[7][:3], "seven")
        paths = [str(write(tmp_path / "p.jsonl", "jsonl", rows))]
    elif case == "csv header repeats a name":
        paths = [str(write(tmp_path / "p.csv", "csv", rows, names=("id", "question", "answer", "id")))]
    elif case == "parquet repeats a name":
        table = pa.table({"question": [r[1] for r in rows], "answer": [r[2] for r in rows]})
        pq.write_table(table.append_column("answer", table.column("question")), tmp_path / "p.parquet")
        paths = [str(tmp_path / "p.parquet")]
    elif case == "header only":
        paths = [str(write(tmp_path / "p.csv", "csv", []))]
    elif case == "header-only files":
        paths = [str(write(tmp_path / "a.csv", "csv", [])), str(write(tmp_path / "b.csv", "csv", []))]
    elif case == "gzip by its name":
        (tmp_path / "p.csv.gz").write_bytes(gzip.compress(write(tmp_path / "p.csv", "csv", rows).read_bytes()))
        paths = [str(tmp_path / "p.csv.gz")]
    elif case == "gzip inside":
        data = gzip.compress(write(tmp_path / "p.csv", "csv", rows).read_bytes())
        (tmp_path / "p.csv").write_bytes(data)
        paths = [str(tmp_path / "p.csv")]
    elif case == "files with other columns":
        paths = [str(write(tmp_path / "a.csv", "csv", rows)),
                 str(write(tmp_path / "b.csv", "csv", rows, names=("key", "question", "answer", "n")))]
    elif case == "bad --columns":
        paths, cols = [], "sentence1:question"
    elif case == "unknown --columns field":
        paths, cols = [], "label=x"
    else:
        raise AssertionError(case)
    try:
        columns = parse_columns(cols)
        check_inputs(find_pair_files(paths), columns)
    except AugSBERTError as e:
        return e
    return None


ERRORS = {  # case: (type, what the message holds)
    "missing file": (DataError, ["nope.csv: no pair files found"]),
    "glob without a match": (DataError, ["*.tsv: no pair files found"]),
    "unknown extension": (DataError, ["pairs.txt: unknown pair file format", "--format"]),
    "missing column": (DataError, ["p.csv:1: field 'reply' column not found"]),
    "unmapped column": (DataError, ["p.csv:1: field 'sentence1' column not found"]),
    "empty sentence": (DataError, ["p.csv:8: field 'sentence1' empty sentence"]),
    "short csv row": (DataError, ["p.csv:13:", "missing (row has"]),
    "jsonl number": (DataError, ["p.jsonl:4: field 'sentence2' not a string: 42"]),
    "parquet nulls": (DataError, ["p.parquet:6: field 'sentence1' not a string: None"]),
    "parquet integers": (DataError, ["p.parquet:1: field 'sentence1' not a string: 0 (a column of int64)"]),
    "score column taken": (DataError, ["p.csv:1: field 'score' the input already has this column",
                                       "--score-column"]),
    "columns of two types": (DataError, ["b.parquet: its columns cannot share one output table with", "a.csv",
                                         "Field n has incompatible types: string vs int64"]),
    "jsonl column of mixed types": (DataError, ["p.jsonl:8: field 'n' a string where the lines before hold numbers"]),
    "csv header repeats a name": (DataError, ["p.csv:1: field 'id' this column name is given twice"]),
    "parquet repeats a name": (DataError, ["p.parquet: field 'answer' this column name is given twice"]),
    "header only": (DataError, ["p.csv: no pairs to score: the file holds no rows"]),
    "header-only files": (DataError, ["<pairs>: no pairs to score: none of", "a.csv", "b.csv"]),
    "gzip by its name": (DataError, ["p.csv.gz: a gzip-compressed file: decompress it first"]),
    "gzip inside": (DataError, ["p.csv: is gzip-compressed, not csv: decompress it first"]),
    "files with other columns": (DataError, ["b.csv: its columns differ from those of", "a.csv",
                                             "(it has key; it lacks id)"]),
    "bad --columns": (ConfigError, ["--columns: 'sentence1:question' is not FIELD=COLUMN"]),
    "unknown --columns field": (ConfigError, ["--columns: unknown field 'label'"]),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_input_gets_one_typed_error_naming_file_line_and_field(tmp_path, case):
    error = _error(tmp_path, case)
    kind, parts = ERRORS[case]
    assert type(error) is kind, error
    for part in parts:
        assert part in str(error), str(error)


def test_the_cli_reports_bad_input_in_one_line_before_anything_is_written(tmp_path, capsys):
    from augsbert_ray.cli import main

    rows = _pairs()
    rows[2] = (rows[2][0], rows[2][1], "", 2)
    path = write(tmp_path / "p.tsv", "tsv", rows)
    assert main(["label", "embedded", str(path), "--columns", COLUMNS, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"augsbert: error: {path}:4: field 'sentence2' empty sentence"]
    assert not (tmp_path / "out").exists()


def _silver(rows: pa.Table, first: int) -> pa.Table:
    """What the labelling pipeline commits for a shard: its candidates with a label, in input order."""
    n = rows.num_rows
    return pa.table({schema.ID1: pa.array(np.zeros(n, np.int64)), schema.ID2: pa.array(np.arange(first, first + n)),
                     schema.LABEL: pa.array(np.linspace(0, 1, n), pa.float32())})


def test_the_store_writes_input_rows_with_their_scores_and_a_new_store_finds_them_committed(tmp_path):
    rows = pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"]})
    store = LabelStore(tmp_path / "out", "score")
    store.hold(0, rows, first_row=6)
    assert not store.done(0, "digest-0")
    store.commit(0, _silver(rows, 6), "digest-0")
    part = pq.read_table(tmp_path / "out")  # the folder reads as the scored rows alone
    assert part.column_names == ["id", "text", "score"] and part.column("id").to_pylist() == ["a", "b", "c"]
    np.testing.assert_allclose(part.column("score").to_numpy(), [0, 0.5, 1])
    again = LabelStore(tmp_path / "out", "score")
    assert again.done(0, "digest-0") and not again.done(0, "another input")
    store.hold(1, rows, first_row=0)
    with pytest.raises(AugSBERTError, match="not the shard's rows in input order"):
        store.commit(1, _silver(rows, 1), "digest-1")


def test_a_staging_store_keeps_the_rows_of_shards_not_committed_on_disk_until_their_commit(tmp_path):
    rows = pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"]})
    store = LabelStore(tmp_path / "out", "score", staging=tmp_path / "out" / "_staging" / "rows")
    store.hold(0, rows, first_row=6)
    assert not store.done(0, "digest-0")
    staged = list((tmp_path / "out" / "_staging" / "rows").iterdir())
    assert len(staged) == 1 and not any(isinstance(held, pa.Table) for held, _ in store._held.values())
    store.commit(0, _silver(rows, 6), "digest-0")
    assert not staged[0].exists()  # committed: its rows are in the output now
    assert pq.read_table(tmp_path / "out").column("id").to_pylist() == ["a", "b", "c"]
    again = LabelStore(tmp_path / "out", "score", staging=tmp_path / "out" / "_staging" / "rows")
    again.hold(0, rows, first_row=6)
    assert again.done(0, "digest-0") and not list((tmp_path / "out" / "_staging" / "rows").iterdir())


def test_the_spool_hands_the_pool_each_pending_shard_once_and_removes_it_at_its_commit(tmp_path):
    """``labeling.spool``: the reading tasks cover the pending shards in order, one to a task,
    and give back each shard's rows as they were put, with its ``SHARD`` column."""
    from augsbert_ray.labeling import spool
    from augsbert_ray.labeling.driver import _Pending
    from augsbert_ray.labeling.shards import SHARD

    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "shard-000009.arrow").write_bytes(b"a killed run's")
    box = spool.ShardSpool(tmp_path / "spool", "node")
    assert not list((tmp_path / "spool").iterdir())  # emptied when opened
    blocks = {i: pa.table({"text": [f"{i}-{j}" for j in range(5 if i < 6 else 2)], SHARD: [i] * (5 if i < 6 else 2)})
              for i in (0, 2, 3, 5, 6)}
    pending = {i: _Pending(None, "", b.num_rows, box.put(i, b), i) for i, b in blocks.items()}
    tasks = box.source.tasks(pending)
    assert [t["shards"] for t in tasks] == [[0], [2], [3], [5], [6]]  # each shard comes back on its own
    read = pa.concat_tables([box.source.read(pa.Table.from_pylist([t])) for t in tasks])
    assert read.equals(pa.concat_tables(list(blocks.values())))
    assert pending[3].block().equals(blocks[3])  # as a warm host is handed it
    box.remove(3)
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == [
        f"shard-{i:06d}.arrow" for i in (0, 2, 5, 6)]
    box.close()
    assert not (tmp_path / "spool").exists()


def test_a_shard_that_cannot_be_spooled_is_one_error_naming_the_folder(tmp_path, monkeypatch):
    from augsbert_ray.errors import LabelingError
    from augsbert_ray.labeling import spool

    def full(path, mode):
        open(path, "wb").close()  # the temporary file is made, then the disk is full
        raise OSError(28, "No space left on device")

    box = spool.ShardSpool(tmp_path / "spool", "node")
    monkeypatch.setattr(spool.pa, "OSFile", full)
    with pytest.raises(LabelingError, match=r"spool: cannot keep a shard waiting for its labels there: .*No space"):
        box.put(0, pa.table({"text": ["a"]}))
    assert not list((tmp_path / "spool").iterdir())  # no half-written file is left


def test_an_output_folder_takes_only_the_same_labelling_unless_fresh(tmp_path):
    record = {"model": "m", "inputs": [["a.csv", 10, 1]], "max_length": 128}
    out = tmp_path / "out"
    check_output(out, record, fresh=False)  # a new folder
    open_output(out, record, fresh=False)
    check_output(out, record, fresh=False)  # the same labelling resumes
    with pytest.raises(AugSBERTError, match=r"another labelling \(model, max_length differ\).*--fresh"):
        check_output(out, {**record, "model": "n", "max_length": 64}, fresh=False)
    check_output(out, {**record, "model": "n"}, fresh=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(AugSBERTError, match="holds other files"):
        check_output(tmp_path / "other", record, fresh=True)


def test_a_folder_another_labelling_holds_or_an_unreachable_cluster_is_refused_at_once(tmp_path, monkeypatch):
    import socket

    import augsbert_ray
    from augsbert_ray.cluster_address import ClusterAddressError
    from augsbert_ray.run_lock import RunDirBusy, RunLock

    path = write(tmp_path / "p.csv", "csv", _pairs())
    out = tmp_path / "out"
    with RunLock(out, what="--out"):  # as a labelling that is running holds it
        for fresh in (False, True):  # --fresh would wipe the folder under it
            with pytest.raises(RunDirBusy, match=rf"--out {out} is in use by run {os.getpid()} on host "
                                                 rf"{socket.gethostname()}"):
                augsbert_ray.label("embedded", str(path), out, columns=COLUMNS, fresh=fresh)
    assert not out.exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed}")
    with pytest.raises(ClusterAddressError, match="from the RAY_ADDRESS environment variable.*no Ray cluster answers"):
        augsbert_ray.label("embedded", str(path), out, columns=COLUMNS)
    assert not out.exists()
