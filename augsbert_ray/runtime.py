"""The only module that starts or connects to Ray, and decides resources from the cluster.

``start_ray`` also decides what Ray may print. With ``verbose=False`` (what ``augsbert
run`` uses unless given ``--verbose``; ``quiet_ray_output``) Ray's own messages stay off
the terminal:

- Ray Data: no progress bars and no "Starting execution" lines (``DataContext``), so no
  "Active & requested resources" blocks every 10 s either (that is the non-tty form of
  its progress bars).
- Ray Train: its console log level is WARNING (``ray.train.LoggingConfig``, through
  ``train_log_level()``), which drops "Checkpoint successfully created" and the
  worker-group start-up lines; Ray Train's own files in the session log directory still
  have every level. "Reporting training result N" is logged on a logger Ray Train's level
  does not reach; the worker set-up hook quiets it (``pin_worker_to_cluster``). Its print
  patch is off in either mode (``RAY_TRAIN_ENABLE_PRINT_PATCH=0``), so a line printed in a
  worker is not also logged.
- The driver's Ray loggers ("ray", "ray.data", "ray.train", "ray.tune": the token
  authentication notice, "Started a local Ray instance", Ray Data's notices) write to
  ``<log_dir>/ray.log`` instead of the terminal, or, without a ``log_dir``, only their
  warnings reach it.
- Worker lines with Ray's colour codes would be unreadable in a file: ``RAY_COLOR_PREFIX=0``.

What Ray still prints (lines forwarded from workers, native warnings of Ray's C++ core,
error notices of dead workers) is kept off the terminal by ``ray_logs.RayOutput``, which
``augsbert run`` wraps around a job; ``--verbose`` shows everything as before.

``start_ray`` also keeps a job to its own cluster. A local run's workers are pinned to it
(``pin_worker_to_cluster``), so another Ray on the same host can neither confuse nor
receive them; the driver's ``RAY_ADDRESS`` is set to the cluster it joined, for the
processes it starts. A ``RAY_ADDRESS`` the user set still chooses the cluster.

A local Ray that this module starts (no address given) is the job's own:

- it listens on 127.0.0.1 only, and its metrics exporter is off (see ``_local_only``);
- it is stopped when the job ends, on an error, on SIGINT or SIGTERM (``stop_ray``):
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
from dataclasses import dataclass, field
from pathlib import Path

from augsbert_ray import signals
from augsbert_ray.errors import AugSBERTError

log = logging.getLogger(__name__)

# Loggers of Ray's driver-side libraries whose console output start_ray redirects.
RAY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

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
# process, per training run) has nothing to watch. A local Ray's log monitor (it carries the
# workers' output to the driver) scans for new log files 10 times a second until there are
# 1,000 of them, a scan that grows with every worker process the job has started: twice a
# second is soon enough for a new worker's first line and takes half the CPU (idle, after 60
# one-call tasks: 2.9 CPU-s a minute, 1.4 at twice a second; benchmarks/train_overhead.py).
# Users' own settings win.
TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
LOCAL_TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}


def local_ray_options(num_cpus: int | None = None) -> dict:
    """``ray.init`` arguments for a Ray started inside this process.

    Ray keeps at most as many idle worker processes as the node has CPUs and kills the rest
    after a second; each training run's actors count against that, so on a small machine the
    warm worker that scored the last model is gone by the next evaluation, which then pays
    about 10 s of imports again (Ray Data and Ray Train keep several helper actors too). A few
    more idle workers (each holds its imports, a few hundred MB) keep them warm.

    The metrics exporter is off: its Prometheus port answers without the cluster's token, and
    the job reads no metrics from it.
    """
    cpus = num_cpus or os.cpu_count() or 1
    return {"num_cpus": cpus,
            "_system_config": {"num_workers_soft_limit": int(cpus) + 8, "enable_metrics_collection": False}}


@dataclass
class _Settings:
    """What start_ray changed in this process, so that stop_ray can put it back."""

    verbose: bool = True
    env: dict = field(default_factory=dict)  # name -> value before (None: unset)
    handlers: list = field(default_factory=list)  # (logger, handler, level before, removed)
    added: list = field(default_factory=list)  # (logger, handler) that start_ray added
    data_context: dict = field(default_factory=dict)


_settings = _Settings()
_pinned: dict = {}  # the RAY_ADDRESS start_ray set in this process, and the value before
_owned: list = []  # non-empty while the Ray of this process is one start_ray started or joined


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
        verbose: False keeps Ray's own messages off the terminal (see the module docstring).
            Applied, like everything here, only when this call starts or connects Ray.
        log_dir: where the driver's Ray loggers write (``ray.log``) when not ``verbose``.

    Returns:
        The CPUs and GPUs the cluster has.
    """
    import ray

    global _local, _settings
    ctx = None
    os.environ.update(env_vars or {})
    for key, value in TRAIN_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not ray.is_initialized():
        _settings = _Settings(verbose=verbose)
        # RAY_ADDRESS left by an earlier start_ray of this process names a cluster that is gone.
        if _pinned and os.environ.get("RAY_ADDRESS") == _pinned.get("address"):
            _unpin()
        address = address or os.environ.get("RAY_ADDRESS") or None
        _set_env({"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}, only_unset=True)
        if not verbose:
            quiet_ray_output(log_dir)  # before ray.init, which logs the token notice
        job_env = {**(env_vars or {})}
        ours = signals.active()
        if ours:  # Ctrl-C ends the job, not only the Ray Tune run in progress (see signals)
            _set_env({"TUNE_DISABLE_SIGINT_HANDLER": "1"}, only_unset=True)
        if address:
            runtime_env = {"env_vars": job_env} if job_env else None
            try:
                ctx = ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
            except SystemExit as e:  # ray.init's own SIGTERM handler, while it connects
                restore_ray_output()
                raise _interrupted(e, ours) from None
            except (ConnectionError, RuntimeError, TimeoutError, ValueError) as e:
                restore_ray_output()
                raise AugSBERTError(f"Ray address '{address}': could not connect: {_first_line(e)}") from None
            finally:
                if ours:
                    signals.install()
        else:
            for key, value in LOCAL_TRAIN_ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
            # The dashboard (bound to 127.0.0.1) serves the State API that Ray Train relies on.
            # Every worker pins itself to this cluster (pin_worker_to_cluster).
            runtime_env = {"worker_process_setup_hook": pin_worker_to_cluster(quiet=not verbose),
                           **({"env_vars": job_env} if job_env else {})}
            try:
                with _local_only():
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
            _local = {"session": ctx.address_info["session_dir"]}
            atexit.register(stop_ray)
            if not ours:
                _stop_on_sigterm()
        _pin_driver()
        _owned[:] = [True]
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

    processes = _descendants(os.getpid())
    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - nothing to shut down
        pass
    _kill_leftovers(processes, grace_s, {"session": "a start that failed"})
    restore_ray_output()
    _unpin()


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

    global _local
    if not _owned:
        return
    _owned.clear()
    local, _local = _local, None
    processes = _descendants(os.getpid()) if local is not None else []
    try:
        ray.shutdown()
    finally:
        try:
            _kill_leftovers(processes, grace_s, local)
        finally:
            restore_ray_output()
            _unpin()


def _kill_leftovers(processes: list, grace_s: float, local: dict | None) -> None:
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
    stops the local Ray (``stop_ray``). ``ray.init`` installs its own handler, so this runs
    after it; only the main thread can set handlers."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def quiet_ray_output(log_dir: str | os.PathLike | None = None) -> None:
    """Keeps this process's Ray messages off the terminal (``start_ray(verbose=False)`` calls it).

    Ray Data shows no progress and no "Starting execution" lines; the driver's Ray loggers
    write to ``<log_dir>/ray.log`` (without a ``log_dir``, only their warnings reach the
    terminal); Ray Train's console level becomes WARNING (``train_log_level``); forwarded
    worker lines are printed without colour codes. ``restore_ray_output`` undoes it.
    """
    _settings.verbose = False
    _set_env({"RAY_COLOR_PREFIX": "0"}, only_unset=True)
    _quiet_loggers(log_dir)
    _quiet_ray_data()


def restore_ray_output() -> None:
    """Undoes ``quiet_ray_output``."""
    global _settings
    for logger, handler, level, removed in reversed(_settings.handlers):
        handler.setLevel(level)
        if removed and handler not in logger.handlers:
            logger.addHandler(handler)
    for logger, handler in _settings.added:
        logger.removeHandler(handler)
        handler.close()
    if _settings.data_context:
        from ray.data import DataContext

        for name, value in _settings.data_context.items():
            setattr(DataContext.get_current(), name, value)
    for name, value in _settings.env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _settings = _Settings()


def train_log_level() -> str:
    """The console log level of Ray Train runs (``ray.train.LoggingConfig``): INFO when
    verbose, else WARNING (Ray Train's session log files keep every level either way)."""
    return "INFO" if _settings.verbose else "WARNING"


def pin_worker_to_cluster(quiet: bool = False):
    """The Ray worker set-up hook that points ``RAY_ADDRESS`` at the worker's own cluster.

    Code in Ray's workers that looks a cluster up without an address (the State API
    client, ``ray.init(address="auto")``) reads ``RAY_ADDRESS``, then the address file of
    the last ``ray start`` (``/tmp/ray/ray_current_cluster``), then scans the host for GCS
    processes. A local Ray started by ``ray.init()`` writes no address file, so with a
    second Ray on the host the scan finds two and fails: Ray Train's
    ``PlacementGroupCleaner`` then dies with "Found multiple active Ray instances" (and
    with a ``ray start`` cluster on the host it would watch the wrong cluster's actors).

    With ``quiet``, it also keeps Ray Train's "Reporting training result N:
    TrainingReport(...)" (one per checkpoint) off the console: Ray logs it at INFO on a
    logger named after its source file, which Ray Train's own log level does not reach.

    Returns:
        A function for ``runtime_env["worker_process_setup_hook"]``. It is made here, not
        defined at module level, so that Ray ships it by value: a worker runs it without
        importing this package (a hook that fails to import stops every worker). It never
        raises, for the same reason.
    """

    def pin() -> None:
        try:
            import logging
            import os

            import ray

            if not ray.is_initialized():  # only in a connected worker (asking would start a Ray)
                return
            os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
            if quiet:
                source = os.path.join(os.path.dirname(ray.__file__), "train", "v2", "_internal", "execution",
                                      "context.py")
                logging.getLogger(source).setLevel(logging.WARNING)
        except Exception:  # noqa: BLE001
            pass

    return pin


def _pin_driver() -> None:
    """The driver (and any process it starts) uses the cluster it is connected to."""
    import ray

    try:
        if ray.util.client.ray.is_connected():  # Ray Client: the address already says it
            return
        gcs = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001
        return
    previous = os.environ.get("RAY_ADDRESS")
    if previous in (None, "", "auto"):
        _pinned.update(address=gcs, previous=previous)
        os.environ["RAY_ADDRESS"] = gcs


def _unpin() -> None:
    if not _pinned:
        return
    if os.environ.get("RAY_ADDRESS") == _pinned["address"]:
        if _pinned["previous"] is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = _pinned["previous"]
    _pinned.clear()


def _set_env(values: dict[str, str], only_unset: bool) -> None:
    for name, value in values.items():
        if only_unset and name in os.environ:
            continue  # the user's setting wins
        _settings.env.setdefault(name, os.environ.get(name))
        os.environ[name] = value


def _quiet_loggers(log_dir) -> None:
    """Ray's driver-side loggers write to ``<log_dir>/ray.log`` (or only warnings reach the terminal)."""
    import ray  # noqa: F401 - configures the "ray" logger
    import ray.data  # noqa: F401 - configures the "ray.data" logger

    target = None
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        target = logging.FileHandler(Path(log_dir) / "ray.log", encoding="utf-8")
        target.setFormatter(logging.Formatter(LOG_FORMAT))
        target.setLevel(logging.INFO)  # as Ray's console handlers (Ray Data's logger passes DEBUG to its own file)
    for name in RAY_LOGGERS:
        logger = logging.getLogger(name)
        consoles = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)
                    and not isinstance(h, logging.FileHandler)]
        for h in consoles:
            if target is not None:
                logger.removeHandler(h)
                _settings.handlers.append((logger, h, h.level, True))
            else:
                _settings.handlers.append((logger, h, h.level, False))
                h.setLevel(max(h.level, logging.WARNING))
        if target is not None and (consoles or not logger.propagate):
            logger.addHandler(target)
            _settings.added.append((logger, target))


def _quiet_ray_data() -> None:
    """No progress bars (on a non-terminal, the "Active & requested resources" blocks) and
    no per-dataset "Starting execution" lines."""
    from ray.data import DataContext
    from ray.util.debug import log_once

    ctx = DataContext.get_current()
    for name, value in (("enable_progress_bars", False), ("print_on_execution_start", False),
                        ("verbose_stats_logs", False)):
        _settings.data_context.setdefault(name, getattr(ctx, name))
        setattr(ctx, name, value)
    log_once("ray_data_progress_manager_disabled")  # its "Progress bars disabled" notice: said here


def node_capacities() -> list[dict[str, float]]:
    """Each live node's total CPUs and GPUs (``{"CPU": c, "GPU": g}``)."""
    import ray

    return [{"CPU": float(n["Resources"].get("CPU", 0)), "GPU": float(n["Resources"].get("GPU", 0))}
            for n in ray.nodes() if n.get("Alive")]


def fits(requests: list[dict[str, float]], nodes: list[dict[str, float]]) -> bool:
    """Whether ``requests`` (each one task's or actor's CPUs and GPUs) can all run at once on
    ``nodes`` (first fit, largest requests first; exact for the few, similar requests here)."""
    free = [dict(n) for n in nodes]
    for req in sorted(requests, key=lambda r: (-r.get("GPU", 0), -r.get("CPU", 0))):
        for node in free:
            if all(node.get(k, 0) + 1e-9 >= v for k, v in req.items() if v):
                for k, v in req.items():
                    node[k] = node.get(k, 0) - v
                break
        else:
            return False
    return True


def require_resources(requests: list[dict[str, float]], what: str, nodes: list[dict] | None = None) -> None:
    """Fails at once, naming the settings, when ``requests`` cannot all run on the cluster.

    Ray would otherwise queue them and wait for resources that never come (a pipeline whose
    actors hold every CPU leaves none to the tasks that feed them). Checked against the
    cluster's nodes as they are now: an autoscaling cluster that would add nodes for the
    request is better served by asking for less, or starting the nodes first.

    Raises:
        AugSBERTError: naming ``what`` (the settings that size the request) and the cluster.
    """
    from augsbert_ray.errors import AugSBERTError

    nodes = node_capacities() if nodes is None else nodes
    if fits(requests, nodes):
        return
    total = {k: sum(r.get(k, 0) for r in requests) for k in ("CPU", "GPU")}
    have = ", ".join(f"{n['CPU']:g} CPUs and {n['GPU']:g} GPUs" for n in nodes) or "no live node"
    raise AugSBERTError(f"{what} asks for {len(requests)} reservations, {total['CPU']:g} CPUs and {total['GPU']:g} "
                        f"GPUs in all, that cannot run at once on this cluster (nodes: {have}); Ray would wait for "
                        "ever. Ask for less (fewer actors or workers, fewer CPUs or GPUs each) or add nodes.")


def per_worker_cpus(configured: float | None, total_cpus: float, workers: int) -> float:
    """CPUs for each of ``workers`` parallel workers: as configured, else an equal share."""
    if configured is not None:
        return configured
    return max(1.0, float(int(total_cpus // max(1, workers))))


def driver_is_the_only_node() -> bool:
    """Whether the connected Ray cluster is this machine alone: one live node, the driver's.
    Work that needs no placement (scoring a model on a small evaluation set) can then run in
    the driver instead of a worker process that must import everything first."""
    import ray

    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        return len(alive) == 1 and alive[0]["NodeID"] == ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - Ray Client, or a state call that failed: run it as a task
        return False


def remote_call(fn, *args, num_cpus: float = 1, num_gpus: float = 0, what: str | None = None, **kwargs):
    """Runs ``fn(*args, **kwargs)`` as a Ray task with the given resources and waits for it.

    ``what`` names the settings that size the task: with it, a task the cluster cannot place
    fails at once (``require_resources``) instead of waiting.
    """
    import ray

    if what is not None:
        require_resources([{"CPU": num_cpus, "GPU": num_gpus}], what)
    # Ray ends a GPU task's worker process after one call by default (max_calls=1), so every
    # GPU task paid the imports and the CUDA start again: about 13 s to score one small model on
    # an H200. max_calls=0 keeps the worker; the task bodies free their GPU memory when done.
    options = {"num_cpus": num_cpus, "num_gpus": num_gpus, **({"max_calls": 0} if num_gpus else {})}
    return ray.get(ray.remote(**options)(fn).remote(*args, **kwargs))


def dataset_of_blocks(table, rows_per_block: int):
    """A Ray Dataset of ``table`` cut into blocks of ``rows_per_block`` rows.

    Ray Data hands whole blocks to actors, and ``from_arrow`` makes one block of one
    table, so without this cut every actor of a pool but one would sit idle.
    """
    import ray

    blocks = [table.slice(i, rows_per_block) for i in range(0, table.num_rows, rows_per_block)] or [table]
    return ray.data.from_arrow(blocks)


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
