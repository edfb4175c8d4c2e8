"""Run by test_commit_on_actor.py in a process of its own: labelling a candidates file on a
3-node ``ray.cluster_utils.Cluster`` (a head with no CPUs, where the driver and the file are,
and two 1-CPU nodes, one labelling actor each), then a re-run after two manifests are removed.

    python commit_on_actor.py OUT_DIR [STORE_URI]

The shards go to OUT_DIR/shards, or to STORE_URI (a storage URI every node opens, ``s3://...``).
Writes OUT_DIR/result.json: the nodes, the labelling actors' nodes, each shard's manifest, and
the two runs' shard counts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from three_nodes import three_nodes


class NodeScorer:
    """A labelling actor with no model: each pair's label is its id1 / 1000; the actor's node is
    written to ``trace`` when it starts, and each batch is held ``delay_s`` so both actors get
    shards."""

    def __init__(self, trace: str, delay_s: float):
        import ray

        self.delay_s = delay_s
        with open(trace, "a", encoding="utf-8") as f:
            f.write(ray.get_runtime_context().get_node_id() + "\n")

    def __call__(self, batch: pa.Table) -> pa.Table:
        from augsbert_ray import schema

        time.sleep(self.delay_s)
        labels = batch.column(schema.ID1).to_numpy().astype(np.float32) / 1000
        return batch.append_column(schema.LABEL, pa.array(labels, pa.float32()))


def candidates(n: int) -> pa.Table:
    from augsbert_ray import schema

    return pa.table({schema.ID1: pa.array(np.arange(n), pa.int64()), schema.ID2: pa.array(np.arange(n) + n, pa.int64()),
                     schema.SENTENCE1: [f"a man plays the guitar {i}" for i in range(n)],
                     schema.SENTENCE2: [f"a woman slices an onion {i}" for i in range(n)],
                     schema.ORIGIN: ["bm25"] * n, schema.RETRIEVAL_SCORE: pa.array(np.ones(n), pa.float32())},
                    schema=schema.CANDIDATE_SCHEMA)


def main(out: Path, store_at: str | None = None) -> None:
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import LabelingReport, ScorerSpec, ShardStore, label_candidates_file

    out.mkdir(parents=True, exist_ok=True)
    with three_nodes() as (head, workers):
        path = out / "candidates.parquet"
        pq.write_table(candidates(96), path, row_group_size=20)
        trace = out / "actors.txt"
        spec = ScorerSpec(NodeScorer, {"trace": str(trace), "delay_s": 0.3})
        cfg = LabelingConfig(actors=2, block_size=8, tokenize_stage="actor", executor="pool")  # 12 shards
        store = ShardStore(store_at or out / "shards")
        runs = []
        for run in range(2):
            report = LabelingReport()
            n = label_candidates_file(path, out / "silver.parquet", "unused", cfg, 32, 1.0, store=store,
                                      report=report, actors=2, scorer=spec)
            runs.append({"rows": n, "shards": report.shards, "reused": report.reused, "labelled": report.labelled,
                         "redone": sorted(report.redone_shards)})
            if run == 0:
                manifests = {f"part-{i:06d}.json": store.record(i) for i in sorted(store.committed())}
                for i in (3, 7):  # as if a run had been killed before these manifests were written
                    if store.root is None:  # on storage
                        store.fs.delete_file(store.manifest(i))
                    else:
                        store.manifest(i).unlink()
        silver = pq.read_table(out / "silver.parquet")
        ok = silver.column("label").to_pylist() == [np.float32(i / 1000).item() for i in range(96)]
        result = {"head": head, "workers": workers,
                  "actor_nodes": sorted(set(trace.read_text().split())), "manifests": manifests, "runs": runs,
                  "silver_ok": ok and silver.num_rows == 96}
        from augsbert_ray.labeling.driver import file_source

        source = file_source(path, cfg)  # every node sees the file here: the reading tasks run on any
        result.update(readers=sorted(source.readers), selector=source.selector()["ray.io/node-id"])
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
