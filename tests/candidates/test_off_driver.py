"""A large target corpus read and sampled in worker processes: the same files as on the driver,
the work done elsewhere, and a bad line's error as the driver would raise it."""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_sentence

from augsbert_ray.candidates import off_driver, sharded
from augsbert_ray.config import CorpusConfig, SamplingConfig
from augsbert_ray.errors import DataError
from augsbert_ray.stages import candidates as stage


class _NoInputs:
    def __contains__(self, name: str) -> bool:
        return False


def _env(out: Path, progress=None) -> SimpleNamespace:
    out.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(out=out, cluster=SimpleNamespace(cpus=2, nodes=1), ship=None, base_model=None,
                           reporter=lambda: progress, hosts=None)  # no warm hosts: the stage's own pools


class _Display:
    """What a job's display is told (``progress_channel`` replays workers' events on it)."""

    def __init__(self):
        self.totals, self.done = [], 0

    def add_total(self, stage, n, unit=None):
        self.totals.append((stage, n, unit))

    def advance(self, stage, n):
        self.done += n


def _corpus(path: Path, n: int = 300) -> Path:
    rng = random.Random(11)
    lines = [f"{make_sentence(rng)[:-1]} number {rng.randint(0, n // 2)}." for _ in range(n)]
    lines[7] = "   "  # an empty line, counted
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(params, out: Path, caplog) -> tuple:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="augsbert_ray"):
        result = stage._corpus_run(_NoInputs(), params, _env(out))
    line = next(r.getMessage() for r in caplog.records if "corpus sentences" in r.getMessage())
    return result, line


@pytest.mark.parametrize("sampling", [SamplingConfig(strategy="bm25", top_k=2),
                                      SamplingConfig(strategy="rs", random_per_sentence=2)],
                         ids=["bm25", "rs"])
def test_off_the_driver_the_outputs_are_the_drivers(tmp_path, ray_local, monkeypatch, caplog, sampling):
    path = _corpus(tmp_path / "corpus.txt")
    params = stage.CandidatesParams(source="target corpus", seed=3, sampling=sampling,
                                    corpus=CorpusConfig(path=str(path)))
    here, line_here = _run(params, tmp_path / "driver", caplog)
    monkeypatch.setattr(off_driver, "OFF_DRIVER_BYTES", 0)
    monkeypatch.setattr(sharded, "ENABLED", False)  # the single task (test_sharded.py: the sharded path)
    there, line_there = _run(params, tmp_path / "task", caplog)

    assert "pid" not in line_here
    pids = [int(p) for p in re.findall(r"\d+", line_there.split("pids")[1])]
    assert len(pids) == 2 and os.getpid() not in pids, line_there
    assert there.model_dump() == here.model_dump()
    assert here.corpus_lines["empty"] == 1 and here.candidates > 0
    for name in stage.OUTPUTS:
        a, b = pq.read_table(tmp_path / "task" / name), pq.read_table(tmp_path / "driver" / name)
        assert a.schema == b.schema and a.num_rows == b.num_rows, name
        for column in a.column_names:  # RS pairs have no retrieval score: NaN, equal to itself here
            assert np.array_equal(a.column(column).to_numpy(), b.column(column).to_numpy(),
                                  equal_nan=a.field(column).type == pa.float32()), (name, column)


def test_a_bad_line_off_the_driver_is_the_engines_error(tmp_path, ray_local, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_bytes(b"first line\nsecond line\nthird \xff line\nfourth line\n")
    params = stage.CandidatesParams(source="target corpus", sampling=SamplingConfig(strategy="rs"),
                                    corpus=CorpusConfig(path=str(path)))
    monkeypatch.setattr(off_driver, "OFF_DRIVER_BYTES", 0)
    monkeypatch.setattr(sharded, "ENABLED", False)  # the single task (test_sharded.py: the sharded path)
    with pytest.raises(DataError, match=r"c\.txt:3: invalid UTF-8") as e:
        stage._corpus_run(_NoInputs(), params, _env(tmp_path / "out"))
    assert e.value.line == 3
    assert not (tmp_path / "out" / "candidates.parquet").exists()


def test_only_a_large_corpus_leaves_the_driver(ray_local, monkeypatch):
    monkeypatch.setattr(off_driver, "OFF_DRIVER_BYTES", 100)
    monkeypatch.setattr(sharded, "ENABLED", False)  # the single task (test_sharded.py: the sharded path)
    assert not off_driver.wanted([("a", 60, 0), ("b", 40, 0)])
    assert off_driver.wanted([("a", 60, 0), ("b", 41, 0)])


def test_off_the_driver_the_display_gets_the_total_and_the_batches(tmp_path, ray_local, monkeypatch):
    from augsbert_ray.progress.channel import progress_channel

    path = _corpus(tmp_path / "corpus.txt")
    params = stage.CandidatesParams(source="target corpus", sampling=SamplingConfig(strategy="bm25", top_k=2),
                                    corpus=CorpusConfig(path=str(path)))
    monkeypatch.setattr(off_driver, "OFF_DRIVER_BYTES", 0)
    monkeypatch.setattr(sharded, "ENABLED", False)  # the single task (test_sharded.py: the sharded path)
    display = _Display()
    with progress_channel(display) as handle:
        result = stage._corpus_run(_NoInputs(), params, _env(tmp_path / "out", handle.stage("candidates")))
    # The sampler adds the total in the task's own process, then waits on Ray Data's workers.
    assert display.totals == [("candidates", result.sentences, "sentences")]
    assert display.done == result.sentences
