"""The only module that starts or connects to Ray, and decides resources from the cluster.

A local Ray that this module starts (no address given) is the job's own:

- it listens on 127.0.0.1 only, and its metrics exporter is off (see ``_local_only``);
- it is stopped when the job ends, on an error, on SIGINT or SIGTERM (``shutdown_ray``):
  ``ray.shutdown()``, then any process that Ray started for it and that outlived the
  shutdown (agents that ignore SIGTERM) is killed. A process killed with SIGKILL cannot do
  this; Ray's own fate-sharing then stops what it can.

A cluster the job connects to is left running.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

# The local Ray this process started ({"session": its session directory}); None when it
# started none (or connected to a cluster).
_local: dict | None = None


@dataclass(frozen=True)
class ClusterResources:
    cpus: float
    gpus: float
    nodes: int = 1
    memory_gb: float = 0.0
    object_store_gb: float = 0.0
    logs: str | None = None  # where Ray writes this session's logs (on the head node)
    dashboard: str | None = None

    def describe(self) -> str:
        return (f"{self.nodes} node(s), {self.cpus:g} CPUs, {self.gpus:g} GPUs, {self.memory_gb:.1f} GiB memory, "
                f"{self.object_store_gb:.1f} GiB object store")


# Fixed costs of a stage on a small machine: Ray Train's controller polls its workers every
# 2 s (so a training stage ends up to 2 s after its last step; 0.5 s costs nothing measurable),
# and on one machine no node is ever drained, so the preemption watcher (an actor, so a new
# process, per training run) has nothing to watch. Users' own settings of these win.
TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
LOCAL_TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def local_ray_options(num_cpus: int | None = None) -> dict:
    """``ray.init`` arguments for a Ray started inside this process.

    Ray keeps at most as many idle worker processes as the node has CPUs and kills the rest
    after a second; each training run's actors count against that, so on a small machine the
    warm worker that scored the last model is gone by the next evaluation, which then pays
    about 10 s of imports again. A few more idle workers (each holds its imports, a few
    hundred MB) keep them warm.

    The metrics exporter is off: its Prometheus port answers without the cluster's token, and
    the job reads no metrics from it.
    """
    cpus = num_cpus or os.cpu_count() or 1
    return {"num_cpus": cpus,
            "_system_config": {"num_workers_soft_limit": int(cpus) + 4, "enable_metrics_collection": False}}


def start_ray(address: str | None = None, num_cpus: int | None = None,
              env_vars: dict[str, str] | None = None) -> ClusterResources:
    """Connects to a Ray cluster, or starts a local one inside this process.

    Args:
        address: a cluster address ("auto", "host:6379", "ray://..."); None falls back to the
            ``RAY_ADDRESS`` environment variable, then to a new local Ray.
        num_cpus: CPUs of a local Ray (ignored when connecting); None uses every core.
        env_vars: environment variables for the driver and every worker of this job (through
            its runtime environment; not applied when Ray is already initialised).

    Returns:
        The CPUs and GPUs the cluster has.
    """
    import ray

    global _local
    ctx = None
    os.environ.update(env_vars or {})
    runtime_env = {"env_vars": dict(env_vars)} if env_vars else None
    for key, value in TRAIN_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            ctx = ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
        else:
            for key, value in LOCAL_TRAIN_ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
            # The dashboard (bound to 127.0.0.1) serves the State API that Ray Train relies on.
            with _local_only():
                ctx = ray.init(**local_ray_options(num_cpus), dashboard_host="127.0.0.1", log_to_driver=True,
                               runtime_env=runtime_env)
            _local = {"session": ctx.address_info["session_dir"]}
            atexit.register(shutdown_ray)
            _stop_on_sigterm()
    session = (ctx.address_info.get("session_dir") if ctx is not None else None)
    res = ray.cluster_resources()
    gib = 1024**3
    return ClusterResources(
        cpus=float(res.get("CPU", 0)), gpus=float(res.get("GPU", 0)),
        nodes=sum(1 for n in ray.nodes() if n.get("Alive")),
        memory_gb=float(res.get("memory", 0)) / gib, object_store_gb=float(res.get("object_store_memory", 0)) / gib,
        logs=os.path.join(session, "logs") if session else None,
        dashboard=(ctx.dashboard_url or None) if ctx is not None else None,
    )


# Ray's single-host mode. Ray turns an explicit _node_ip_address="127.0.0.1" into the host's
# routable address (services.resolve_ip_for_localhost), so that option cannot keep a local
# Ray off the network; with this variable at 0, Ray takes 127.0.0.1 as the node's address and
# every server binds there: the GCS, the raylet and workers (gRPC), the dashboard agent (gRPC
# and HTTP), the runtime-env agent, and the dashboard's and autoscaler's Prometheus ports.
_SINGLE_HOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class _local_only:
    """Context of ``ray.init`` for a local Ray: every Ray process it starts binds to 127.0.0.1.

    The processes Ray starts read the variable when they import Ray; the driver imported it
    already, so its copy of the flag is set for the duration too. Both are restored after,
    so that a later connection to a real cluster from this process is not affected. A user
    who set the variable keeps their setting.
    """

    def __enter__(self):
        from ray._private import ray_constants

        self._env = os.environ.get(_SINGLE_HOST_ENV)
        self._flag = ray_constants.ENABLE_RAY_CLUSTER
        if self._env is None:
            os.environ[_SINGLE_HOST_ENV] = "0"
            ray_constants.ENABLE_RAY_CLUSTER = False
        return self

    def __exit__(self, *exc):
        from ray._private import ray_constants

        if self._env is None:
            os.environ.pop(_SINGLE_HOST_ENV, None)
        ray_constants.ENABLE_RAY_CLUSTER = self._flag
        return False


def _stop_on_sigterm() -> None:
    """SIGTERM ends the job like an error: ``SystemExit(143)`` unwinds through the CLI, which
    stops the local Ray (``shutdown_ray``). ``ray.init`` installs its own handler, so this runs
    after it; only the main thread can set handlers."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def shutdown_ray(grace_s: float = 5.0) -> None:
    """Stops the local Ray this process started (nothing when it started none).

    ``ray.shutdown()``, then every process Ray had started for it that is still alive after
    ``grace_s`` seconds is killed (found before the shutdown as this process's descendants,
    and identified by process id and start time, so that a reused id is never killed).
    """
    global _local
    if _local is None:
        return
    local, _local = _local, None
    processes = _descendants(os.getpid())
    import ray

    try:
        ray.shutdown()
    finally:
        deadline = time.monotonic() + grace_s
        alive = [p for p in processes if _alive(*p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if _alive(*p)]
        for pid, _ in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                log.info("killed %s, left running by the local Ray of %s", pid, local["session"])
            except OSError:
                pass


def _proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, state) of a process, from /proc (Linux); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name, in parentheses, may hold spaces
    return int(fields[1]), int(fields[19]), fields[0]


def _descendants(root: int) -> list[tuple[int, int]]:
    """(pid, start time) of every descendant of process ``root`` (empty where /proc is missing)."""
    if not os.path.isdir("/proc"):
        return []
    children: dict[int, list[int]] = {}
    start: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _proc_stat(int(name))) is not None:
            children.setdefault(st[0], []).append(int(name))
            start[int(name)] = st[1]
    out, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        out.append((pid, start[pid]))
        stack.extend(children.get(pid, []))
    return out


def _alive(pid: int, started: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[1] == started and st[2] != "Z"


def per_worker_cpus(configured: float | None, total_cpus: float, workers: int) -> float:
    """CPUs for each of ``workers`` parallel workers: as configured, else an equal share."""
    if configured is not None:
        return configured
    return max(1.0, float(int(total_cpus // max(1, workers))))


def remote_call(fn, *args, num_cpus: float = 1, num_gpus: float = 0, **kwargs):
    """Runs ``fn(*args, **kwargs)`` as a Ray task with the given resources and waits for it."""
    import ray

    return ray.get(ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(fn).remote(*args, **kwargs))


def dataset_of_blocks(table, rows_per_block: int):
    """A Ray Dataset of ``table`` cut into blocks of ``rows_per_block`` rows.

    Ray Data hands whole blocks to actors, and ``from_arrow`` makes one block of one
    table, so without this cut every actor of a pool but one would sit idle.
    """
    import ray

    blocks = [table.slice(i, rows_per_block) for i in range(0, table.num_rows, rows_per_block)] or [table]
    return ray.data.from_arrow(blocks)
