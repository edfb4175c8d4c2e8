"""Shards committed where they are labelled: on a 3-node ``ray.cluster_utils.Cluster``, each
shard's Parquet file and manifest are written by the node whose actor labelled it, not by the
driver's, and a re-run verifies the committed shards and labels only those whose manifest is
missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_each_shard_is_committed_by_the_node_that_labelled_it(tmp_path):
    out = tmp_path / "out"
    # A process of its own: the session's local Ray and a Cluster cannot share one driver.
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("commit_on_actor.py")), str(out)],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    manifests = result["manifests"]
    assert len(manifests) == 12 and result["silver_ok"]
    writers = {m["writer"] for m in manifests.values()}
    # every shard written by a labelling actor's node; both actors' nodes wrote; the driver's none
    assert set(result["actor_nodes"]) == set(result["workers"])
    assert writers == set(result["workers"]) and result["head"] not in writers
    assert all(m["rows"] == 8 and len(m["sha256"]) == 64 for m in manifests.values())
    # the candidates file is the same on every node (one machine's disk): every node may read shards
    assert result["readers"] == sorted([result["head"], *result["workers"]])
    assert result["selector"].startswith("in(") and all(n in result["selector"] for n in result["readers"])
    first, again = result["runs"]
    assert first == {"rows": 96, "shards": 12, "reused": 0, "labelled": 12, "redone": first["redone"]}
    assert sorted(first["redone"]) == list(range(12))
    assert {**again, "redone": sorted(again["redone"])} == {"rows": 96, "shards": 12, "reused": 10, "labelled": 2,
                                                             "redone": [3, 7]}
