"""A local run keeps to its own Ray when another Ray runs on the same host, and stays quiet.

A second Ray (``ray start --head``, its own temp dir, ports and HOME) runs beside the
engine's local Ray, which a subprocess starts with ``start_ray(verbose=False)`` under
``RayOutput`` and the progress display, as ``augsbert run`` does. A worker then looks its
cluster up without an address, as Ray Train's ``PlacementGroupCleaner`` does through the
State API: with two GCS processes on the host and no address file, Ray raises "Found
multiple active Ray instances" unless the worker was pinned to its cluster. The second Ray
is stopped by ending its ``--block`` process group (never ``ray stop``, which stops every
Ray on the host).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, free_ports

BIN = Path(sys.executable).parent

ENGINE = textwrap.dedent('''
    import sys, time
    from pathlib import Path

    import ray

    from augsbert_ray.progress import JobProgress
    from augsbert_ray.progress.ray_logs import RayOutput
    from augsbert_ray.runtime import start_ray

    logs = Path(sys.argv[1])
    with RayOutput(logs / "ray.log", poll_s=0.1) as out, JobProgress(["probe"], stream=out.terminal,
                                                                    log_path=logs / "job.log") as progress:
        out.follow(progress.message)
        start_ray(num_cpus=1, verbose=False, log_dir=logs)
        progress.start_stage("probe")

        @ray.remote(num_cpus=0)
        def probe():
            from ray._private.services import canonicalize_bootstrap_address_or_die

            print("[probe] a worker looks its cluster up", flush=True)
            return canonicalize_bootstrap_address_or_die(None) == ray.get_runtime_context().gcs_address

        progress.message(f"[probe] the worker found its own cluster: {ray.get(probe.remote())}")
        time.sleep(1.5)  # the worker's line reaches the driver, then the log follower
        progress.finish_stage("probe")
''')


@pytest.fixture
def other_ray():
    """A second Ray on this host, started with ``ray start --head --block``."""
    tmp = Path(tempfile.mkdtemp(prefix="aro-", dir="/tmp"))  # short: Ray's socket paths must stay short
    (tmp / "home").mkdir()
    gcs, *ports = free_ports(7)
    # Its own HOME holds no token of the user's, so it gets one of its own (Ray's token
    # authentication needs one to start a head).
    env = {**os.environ, "HOME": str(tmp / "home"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
         "--include-dashboard", "false", "--dashboard-agent-listen-port", str(ports[0]),
         "--dashboard-agent-grpc-port", str(ports[1]), "--metrics-export-port", str(ports[2]),
         "--runtime-env-agent-port", str(ports[3]), "--node-manager-port", str(ports[4]),
         "--object-manager-port", str(ports[5]), "--num-cpus", "1", "--temp-dir", str(tmp / "r"),
         "--disable-usage-stats"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        deadline = time.time() + 90
        while True:  # its GCS listens once it is up
            if proc.poll() is not None:
                raise RuntimeError(f"ray start failed:\n{proc.stdout.read()}")
            try:
                socket.create_connection(("127.0.0.1", gcs), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError("the second Ray did not come up in 90 s")
                time.sleep(0.5)
        yield f"127.0.0.1:{gcs}"
    finally:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left
        except ProcessLookupError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_worker_hook_pins_the_cluster_and_travels_by_value(ray_local):
    """The fast part of the story: the hook, run in a worker, points RAY_ADDRESS at the
    worker's cluster, and it loads where this package cannot be imported."""
    import ray
    import ray.cloudpickle

    from augsbert_ray.runtime import pin_worker_to_cluster

    hook = pin_worker_to_cluster(quiet=True)
    # Outside a worker the hook does nothing (asking Ray for the cluster would start one).
    load = ("import os, pickle, sys; sys.modules['augsbert_ray'] = None; "
            "f = pickle.loads(sys.stdin.buffer.read()); f(); print(callable(f), os.environ.get('RAY_ADDRESS'))")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    loaded = subprocess.run([sys.executable, "-c", load], input=ray.cloudpickle.dumps(hook), capture_output=True,
                            timeout=60, env=env)
    assert loaded.stdout.strip() == b"True None", loaded.stderr.decode()
    assert b"Started a local Ray" not in loaded.stderr

    @ray.remote(num_cpus=0)
    def probe(hook):
        from ray._private.services import canonicalize_bootstrap_address_or_die

        before = os.environ.pop("RAY_ADDRESS", None)
        try:
            hook()
            return os.environ.get("RAY_ADDRESS"), canonicalize_bootstrap_address_or_die(None)
        finally:
            os.environ.pop("RAY_ADDRESS", None)
            if before is not None:
                os.environ["RAY_ADDRESS"] = before

    own = ray.get_runtime_context().gcs_address
    assert ray.get(probe.remote(hook)) == (own, own)


@pytest.mark.slow  # two Ray starts on a busy 2-core machine: about 40 s
@pytest.mark.timeout(180)
def test_a_local_run_keeps_to_its_own_ray_beside_another(other_ray, tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run([sys.executable, "-c", ENGINE, str(tmp_path / "logs")], env=env, capture_output=True,
                         text=True, timeout=150)
    terminal = run.stdout + run.stderr
    ray_log = (tmp_path / "logs" / "ray.log").read_text()
    assert run.returncode == 0, terminal + ray_log
    assert "[probe] the worker found its own cluster: True" in terminal
    assert "[probe] a worker looks its cluster up" in terminal  # a worker's engine line, through Ray's log
    assert "multiple active Ray instances" not in terminal + ray_log
    # Ray's own notices are in the run's log, not on the terminal.
    assert "Started a local Ray instance" in ray_log
    for noise in ("Started a local Ray instance", "Token authentication", "(pid=", "pid=", "INFO", "WARNING"):
        assert noise not in terminal
