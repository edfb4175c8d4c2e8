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
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# Loggers of Ray's driver-side libraries whose console output start_ray redirects.
RAY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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

    ctx = None
    os.environ.update(env_vars or {})
    if not ray.is_initialized():
        global _settings
        _settings = _Settings(verbose=verbose)
        # RAY_ADDRESS left by an earlier start_ray of this process names a cluster that is gone.
        if _pinned and os.environ.get("RAY_ADDRESS") == _pinned.get("address"):
            _unpin()
        address = address or os.environ.get("RAY_ADDRESS") or None
        _set_env({"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}, only_unset=True)
        if not verbose:
            quiet_ray_output(log_dir)  # before ray.init, which logs the token notice
        job_env = {**(env_vars or {})}
        if address:
            runtime_env = {"env_vars": job_env} if job_env else None
            ctx = ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
        else:
            # The dashboard (bound to 127.0.0.1) serves the State API that Ray Train relies on.
            # Every worker pins itself to this cluster (pin_worker_to_cluster).
            runtime_env = {"worker_process_setup_hook": pin_worker_to_cluster(quiet=not verbose),
                           **({"env_vars": job_env} if job_env else {})}
            ctx = ray.init(num_cpus=num_cpus or os.cpu_count(), dashboard_host="127.0.0.1", log_to_driver=True,
                           runtime_env=runtime_env)
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


def stop_ray() -> None:
    """Shuts down the Ray that ``start_ray`` started or joined (a Ray initialised by other
    code is left running) and undoes what ``start_ray`` changed in this process (loggers,
    environment, Ray Data settings, the pinned ``RAY_ADDRESS``)."""
    import ray

    if not _owned:
        return
    ray.shutdown()
    _owned.clear()
    restore_ray_output()
    _unpin()


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
