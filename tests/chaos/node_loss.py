"""Run by test_node_loss.py in a process of its own: labelling on a multi-node
``ray.cluster_utils.Cluster`` while the node of one labelling actor is removed.

    python node_loss.py TEACHER OUT_DIR

Writes OUT_DIR/result.json (the removed node, shard counts) and OUT_DIR/silver.parquet.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def candidates(n: int) -> pa.Table:
    from augsbert_ray import schema

    rng = random.Random(3)
    words = ["a man", "a dog", "plays", "eats", "the guitar", "an apple", "slowly", "at home"]

    def sent() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))

    return pa.table(
        {
            schema.ID1: pa.array(np.arange(n) * 2, pa.int64()),
            schema.ID2: pa.array(np.arange(n) * 2 + 1, pa.int64()),
            schema.SENTENCE1: [sent() for _ in range(n)],
            schema.SENTENCE2: [sent() for _ in range(n)],
            schema.ORIGIN: ["bm25"] * n,
            schema.RETRIEVAL_SCORE: pa.array(np.ones(n), pa.float32()),
        },
        schema=schema.CANDIDATE_SCHEMA,
    )


def main(teacher: str, out: Path) -> None:
    import os

    import ray
    from ray.cluster_utils import Cluster

    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import TRACE_ENV, LabelingReport, ShardStore, label_candidates
    from augsbert_ray.progress.messages import lines_to

    out.mkdir(parents=True, exist_ok=True)
    os.environ[TRACE_ENV] = json.dumps({"path": str(out / "trace.txt"), "delay_s": 0.4})
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the driver's node runs no actor
    workers = [cluster.add_node(num_cpus=1) for _ in range(3)]  # two actors, one spare node
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()

    cands = candidates(160)  # 20 shards of 8
    store = ShardStore(out / "shards")
    report = LabelingReport()
    result: dict = {}
    lines: list[str] = []

    def label() -> None:
        try:
            cfg = LabelingConfig(actors=2, block_size=8, micro_batch_size=8, precision="fp32")  # labels checked exactly
            with lines_to(lines.append):
                result["silver"] = label_candidates(cands, teacher, cfg, 32, 1, store=store, report=report)
        except BaseException as e:  # reported to the test below
            result["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=label)
    thread.start()
    while len(list(store.root.glob("part-*.json"))) < 4 and thread.is_alive():
        time.sleep(0.05)
    # Remove a node that hosts a labelling actor (not the spare one).
    busy = {line.split()[1] for line in (out / "trace.txt").read_text().splitlines() if line.startswith("actor ")}
    victim = next(w for w in workers if w.node_id in busy)
    committed_before = len(list(store.root.glob("part-*.json")))
    cluster.remove_node(victim, allow_graceful=False)
    thread.join(timeout=600)
    # The control store marks a killed node dead only after its health checks fail, which can
    # come after labelling has already finished: wait for that before counting the nodes.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(n["NodeID"] == victim.node_id and n["Alive"] for n in ray.nodes()):
        time.sleep(0.5)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"removed_node": victim.node_id, "committed_before_removal": committed_before,
               "shards": report.shards, "labelled": report.labelled, "error": result.get("error"),
               "alive_nodes": sum(n["Alive"] for n in ray.nodes()), "log": lines}
    if "silver" in result:
        pq.write_table(result["silver"], out / "silver.parquet")
        pq.write_table(cands, out / "candidates.parquet")
    (out / "result.json").write_text(json.dumps(summary))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
