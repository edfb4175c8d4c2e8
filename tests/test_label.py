"""``augsbert_ray.label`` on Ray: a run stopped after two committed shards resumes without
scoring them again, and every pair comes out exactly once with the cross-encoder's score."""

from __future__ import annotations

import csv
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import augsbert_ray
from augsbert_ray.labeling.output import LabelStore
from conftest import make_sentence

N, BLOCK = 26, 8  # 4 shards


@pytest.mark.slow
def test_a_stopped_run_resumes_and_yields_each_pair_once_with_the_models_score(ray_local, tiny_cross_encoder,
                                                                                tmp_path, monkeypatch):
    from augsbert_ray.models import load_cross_encoder
    from augsbert_ray.scoring import score_pairs

    rng = random.Random(5)
    rows = [(f"id{i}", make_sentence(rng) + " and more" * rng.randint(0, 3), make_sentence(rng)) for i in range(N)]
    path = tmp_path / "pairs.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("key", "q", "a"), *rows])
    out = tmp_path / "out"
    options = dict(columns="sentence1=q,sentence2=a", precision="fp32", block_size=BLOCK, actors=1, max_length=64)

    commit, commits = LabelStore.commit, []

    def stop_after_two(self, i, table, digest):
        if len(commits) == 2:
            raise KeyboardInterrupt  # as Ctrl-C would, between two commits
        commit(self, i, table, digest)
        commits.append(i)

    monkeypatch.setattr(LabelStore, "commit", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        augsbert_ray.label(tiny_cross_encoder, str(path), out, **options)
    assert len(list(out.glob("part-*.parquet"))) == 2
    assert not (out / "_staging").exists()  # the shards that waited on disk go with the run
    monkeypatch.setattr(LabelStore, "commit", commit)

    put, real_put = [], ray_local.put
    monkeypatch.setattr(ray_local, "put", lambda value, **kw: put.append(value) or real_put(value, **kw))
    summary = augsbert_ray.label(tiny_cross_encoder, str(path), out, **options)
    assert (summary.pairs, summary.shards, summary.reused_shards) == (N, 4, 2)
    # the pending shards and their input rows waited on the driver's disk, not in the object store
    # (Ray Data puts only the reading tasks' descriptions)
    assert not [v for v in put if isinstance(v, pa.Table) and {"q", "sentence1"} & set(v.column_names)]
    assert not (out / "_staging").exists()
    assert summary.labelled_pairs == N - 2 * BLOCK
    table = pq.read_table(out)
    assert table.column_names == ["key", "q", "a", "score"]
    assert sorted(table.column("key").to_pylist()) == sorted(r[0] for r in rows)  # each pair once
    table = table.sort_by("key")
    expect = {r[0]: r for r in rows}
    model, tok = load_cross_encoder(tiny_cross_encoder)
    model.eval()
    keys = table.column("key").to_pylist()
    reference = score_pairs(model, tok, [expect[k][1] for k in keys], [expect[k][2] for k in keys], max_length=64)
    np.testing.assert_allclose(table.column("score").to_numpy(), reference, atol=1e-5)
