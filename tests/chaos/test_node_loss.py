"""Chaos: on a ``ray.cluster_utils.Cluster`` of several nodes, the node of a labelling actor
is removed mid-labelling. Ray restarts the actor on the spare node, the lost batch is redone,
and the silver set is complete and duplicate-free, with the labels a fault-free run gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from augsbert_ray import schema
from augsbert_ray.labeling import score_pairs
from augsbert_ray.models import load_cross_encoder

pytestmark = pytest.mark.slow


def test_labelling_survives_a_lost_node(tiny_model, tmp_path):
    import torch

    model, tok = load_cross_encoder(tiny_model)
    model.save_pretrained(tmp_path / "ce")
    tok.save_pretrained(tmp_path / "ce")
    out = tmp_path / "out"
    script = Path(__file__).with_name("node_loss.py")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "ce"), str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    print("\n", result)
    assert result["error"] is None and result["alive_nodes"] == 3  # head + the two nodes left
    assert 4 <= result["committed_before_removal"] < result["shards"] == result["labelled"] == 20
    silver, cands = pq.read_table(out / "silver.parquet"), pq.read_table(out / "candidates.parquet")
    keys = list(zip(silver.column(schema.ID1).to_pylist(), silver.column(schema.ID2).to_pylist()))
    assert keys == list(zip(cands.column(schema.ID1).to_pylist(), cands.column(schema.ID2).to_pylist()))
    assert len(set(keys)) == len(keys) == 160  # complete, no pair doubled
    torch.set_num_threads(1)
    model, tok = load_cross_encoder(str(tmp_path / "ce"))
    model.eval()
    expect = score_pairs(model, tok, cands.column(schema.SENTENCE1).to_pylist(),
                         cands.column(schema.SENTENCE2).to_pylist(), micro_batch_size=8, max_length=32)
    np.testing.assert_allclose(silver.column(schema.LABEL).to_numpy(), expect, atol=1e-5)
