"""Starting, joining and stopping Ray: the only module that calls ``ray.init``.

``start_ray`` connects to a cluster (an address, else ``RAY_ADDRESS``) or starts a local Ray
inside the process; with ``verbose=False`` it keeps Ray's own messages off the terminal
(``output``), and it keeps the job to its own cluster (``isolation``).

A local Ray that this module starts (no address given) is the job's own:

- it listens on 127.0.0.1 only, and its metrics exporter is off (``isolation.local_only``);
- it is stopped when the job ends, on an error, on SIGINT or SIGTERM (``stop_ray``):
  ``ray.shutdown()``, then any process that Ray started for it and that outlived the
  shutdown (agents that ignore SIGTERM) is killed (``reaping``). A process killed with
  SIGKILL cannot do this; Ray's own fate-sharing then stops what it can.

A cluster the job connects to is left running.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
from dataclasses import dataclass

import psutil

from augsbert_ray import signals
from augsbert_ray.errors import AugSBERTError
from augsbert_ray.runtime import ray_private, state
from augsbert_ray.runtime.isolation import local_only, pin_driver, pin_worker_to_cluster, unpin
from augsbert_ray.runtime.output import quiet_ray_output, restore_ray_output
from augsbert_ray.runtime.reaping import descendants, kill_leftovers


@dataclass(frozen=True)
class ClusterResources:
    """What the cluster a job runs on has, as ``start_ray`` found it."""

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


# Fixed costs of a stage on a small machine, cut (users' own settings win): Ray Train's
# controller polls its workers every 2 s, so a training stage would end up to 2 s after its
# last step; on one machine no node is ever drained, so the preemption watcher (a new actor
# process per training run) has nothing to watch; and a local Ray's log monitor rescans its
# growing log folder 10 times a second, where twice a second (its "many files" pace) is soon
# enough for a worker's first line (benchmarks/train_overhead.py measures the CPU it saves).
TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
LOCAL_TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}


def local_ray_options(num_cpus: int | None = None) -> dict:
    """``ray.init`` arguments for a Ray started inside this process.

    Ray keeps at most as many idle worker processes as the node has CPUs and kills the rest
    after a second; each training run's actors count against that, so on a small machine the
    warm worker that scored the last model is gone by the next evaluation, which then pays
    its imports again (Ray Data and Ray Train keep several helper actors too). A few more
    idle workers (each holds its imports in memory) keep them warm.

    The metrics exporter is off: its Prometheus port answers without the cluster's token, and
    the job reads no metrics from it.
    """
    cpus = num_cpus or os.cpu_count() or 1
    return {"num_cpus": cpus,
            **ray_private.system_config(num_workers_soft_limit=int(cpus) + 8, enable_metrics_collection=False)}


def start_ray(address: str | None = None, num_cpus: int | None = None,
              env_vars: dict[str, str] | None = None, *, verbose: bool = True,
              log_dir: str | os.PathLike | None = None) -> ClusterResources:
    """Connects to a Ray cluster, or starts a local one inside this process.

    Args:
        address: a cluster address ("auto", "host:6379", "ray://..."); None falls back to the
            ``RAY_ADDRESS`` environment variable, then to a new local Ray.
        num_cpus: CPUs of a local Ray (ignored when connecting); None uses every core.
        env_vars: environment variables for the driver and every worker of this job (through
            its runtime environment; not applied when Ray is already initialised).
        verbose: False keeps Ray's own messages off the terminal (see ``runtime.output``).
            Applied, like everything here, only when this call starts or connects Ray.
        log_dir: where the driver's Ray loggers write (``ray.log``) when not ``verbose``.

    Returns:
        The CPUs and GPUs the cluster has.
    """
    import ray

    ctx = None
    os.environ.update(env_vars or {})
    for key, value in TRAIN_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not ray.is_initialized():
        address, job_env, ours = _prepare_start(address, env_vars, verbose, log_dir)
        if address:
            ctx = _connect(address, job_env, ours)
        else:
            ctx = _start_local(num_cpus, job_env, ours, verbose)
        pin_driver()
        state.owned[:] = [True]
    return _cluster_resources(ctx)


def _prepare_start(address: str | None, env_vars: dict[str, str] | None, verbose: bool,
                   log_dir: str | os.PathLike | None) -> tuple[str | None, dict, bool]:
    """Readies this process for a Ray start; returns the address, the job's env vars, whether ``signals`` is on."""
    _auto_connect(True)
    state.settings = state.Settings(verbose=verbose)
    # RAY_ADDRESS left by an earlier start_ray of this process names a cluster that is gone.
    if state.pinned and os.environ.get("RAY_ADDRESS") == state.pinned.get("address"):
        unpin()
    address = address or os.environ.get("RAY_ADDRESS") or None
    state.set_env({"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}, only_unset=True)
    if not verbose:
        quiet_ray_output(log_dir)  # before ray.init, which logs the token notice
    job_env = {**(env_vars or {})}
    ours = signals.active()
    if ours:  # Ctrl-C ends the job, not only the Ray Tune run in progress (see signals)
        state.set_env({"TUNE_DISABLE_SIGINT_HANDLER": "1"}, only_unset=True)
    return address, job_env, ours


def _connect(address: str, job_env: dict, ours: bool):
    """Connects to the cluster at ``address``; a failure is an AugSBERTError naming it."""
    import ray

    runtime_env = {"env_vars": job_env} if job_env else None
    try:
        return ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
    except SystemExit as e:  # ray.init's own SIGTERM handler, while it connects
        restore_ray_output()
        raise _interrupted(e, ours) from None
    except (ConnectionError, RuntimeError, TimeoutError, ValueError) as e:
        restore_ray_output()
        raise AugSBERTError(f"Ray address '{address}': could not connect: {_first_line(e)}") from None
    finally:
        if ours:
            signals.install()


def _start_local(num_cpus: int | None, job_env: dict, ours: bool, verbose: bool):
    """Starts a local Ray inside this process, stopped at exit; a failure is an AugSBERTError."""
    import ray

    for key, value in LOCAL_TRAIN_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    # The dashboard (bound to 127.0.0.1) serves the State API that Ray Train relies on.
    # Every worker pins itself to this cluster (pin_worker_to_cluster).
    runtime_env = {"worker_process_setup_hook": pin_worker_to_cluster(quiet=not verbose),
                   **({"env_vars": job_env} if job_env else {})}
    try:
        with local_only():
            ctx = ray.init(**local_ray_options(num_cpus), dashboard_host="127.0.0.1", log_to_driver=True,
                           runtime_env=runtime_env)
    except SystemExit as e:
        _abandon_local_start()
        raise _interrupted(e, ours) from None
    except Exception as e:  # noqa: BLE001 - e.g. a node that timed out starting on a loaded machine
        _abandon_local_start()
        raise AugSBERTError(f"the local Ray did not start: {_first_line(e)} (Ray's logs: "
                            "/tmp/ray/session_latest/logs; on a busy machine, try again, or give it fewer "
                            "CPUs with ray.num_cpus)") from None
    finally:
        if ours:
            signals.install()
    state.local = {"session": ctx.address_info["session_dir"]}
    atexit.register(stop_ray)
    if not ours:
        _stop_on_sigterm()
    return ctx


def _cluster_resources(ctx) -> ClusterResources:
    """The cluster's CPUs, GPUs, nodes and memory; its logs and dashboard where this call started or connected Ray."""
    import ray

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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _interrupted(e: SystemExit, ours: bool) -> BaseException:
    """``ray.init`` ends the process on SIGTERM with ``sys.exit(15)``: as an interruption
    when the job handles its signals (``signals.handled``)."""
    if ours and e.code == signal.SIGTERM:
        return signals.Interrupted(signal.SIGTERM)
    return e


def _abandon_local_start(grace_s: float = 5.0) -> None:
    """After a ``ray.init`` that failed to start a local Ray: what it started is stopped."""
    import ray

    processes = descendants(os.getpid())
    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - nothing to shut down
        pass
    kill_leftovers(processes, grace_s, "a start that failed")
    restore_ray_output()
    unpin()


def stop_ray(grace_s: float = 5.0) -> None:
    """Shuts down the Ray that ``start_ray`` started or joined (a Ray initialised by other
    code is left running) and undoes what ``start_ray`` changed in this process (loggers,
    environment, Ray Data settings, the pinned ``RAY_ADDRESS``).

    A local Ray it started is stopped for good: ``ray.shutdown()``, then every process Ray had
    started for it that is still alive after ``grace_s`` seconds is killed (found before the
    shutdown as this process's descendants, and identified by process id and start time, so
    that a reused id is never killed).
    """
    import ray

    if not state.owned:
        return
    state.owned.clear()
    if _stage_threads_alive():  # a job that stops part-way: its stages are still unwinding
        _auto_connect(False)
    local, state.local = state.local, None
    processes = descendants(os.getpid()) if local is not None else []
    _end_autoscaler_monitor(processes)
    try:
        ray.shutdown()
    finally:
        try:
            # What outlives the shutdown (the dashboard's module processes) holds nothing of the
            # job's: asked to end, it ends at once instead of at its next look at its parent.
            kill_leftovers(processes, grace_s, local["session"] if local is not None else "", terminate=True)
        finally:
            restore_ray_output()
            unpin()


def _stage_threads_alive() -> bool:
    """Whether threads that run a job's stages (``runner``'s ``stage-NAME``) are still alive."""
    import threading

    return any(t.name.startswith("stage-") and t.is_alive() for t in threading.enumerate())


def _auto_connect(allowed: bool) -> None:
    """Whether a Ray API call made while no Ray is initialised starts or joins one, as Ray
    does by default (``RAY_ENABLE_AUTO_CONNECT``). Off once the job's Ray is stopped while its
    stage threads still unwind (Ctrl-C, an error): their next Ray call must fail, not join the
    cluster just stopped and wait a minute for its GCS; a job that ends whole leaves it as it
    was. On again at the next ``start_ray``. (A flag internal to Ray: ``ray_private``.)"""
    ray_private.set_auto_connect(allowed)


def _end_autoscaler_monitor(processes: list) -> None:
    """Kills the autoscaler monitor of a local Ray among ``processes``. ``ray.shutdown`` stops it
    after the GCS, and its SIGTERM handler then waits on the gone GCS until Ray kills it a second
    later; a one-node Ray started for one job has nothing for it to scale or to report."""
    marker = os.path.join("autoscaler", "_private", "monitor.py")
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if any(arg.endswith(marker) for arg in process.cmdline()):
                process.kill()


def _stop_on_sigterm() -> None:
    """SIGTERM ends the job like an error: ``SystemExit(143)`` unwinds through the CLI, which
    stops the local Ray (``stop_ray``). ``ray.init`` installs its own handler, so this runs
    after it; only the main thread can set handlers."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


