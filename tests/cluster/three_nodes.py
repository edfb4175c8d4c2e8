"""The 3-node ``ray.cluster_utils.Cluster`` the scripts here run on, and how the tests run those
scripts: each in a process of its own, since the session's local Ray and a Cluster cannot share
one driver."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


@contextlib.contextmanager
def three_nodes():
    """A head with no CPUs, where the driver is, and two 1-CPU nodes, with the driver connected;
    yields (the head's node id, the two other nodes' ids)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield ray.get_runtime_context().get_node_id(), [w.node_id for w in workers]
    finally:
        ray.shutdown()
        cluster.shutdown()


def run_script(name: str, out: Path, *args: str, timeout: float = 280) -> dict:
    """Runs ``python HERE/name out *args`` and returns the ``out/result.json`` it wrote."""
    proc = subprocess.run([sys.executable, str(HERE / name), str(out), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((Path(out) / "result.json").read_text())
