"""What Ray may print: with ``quiet_ray_output`` Ray's own messages stay off the terminal.

- Ray Data: no progress bars and no "Starting execution" lines (``DataContext``), so no
  "Active & requested resources" blocks either (the non-tty form of its progress bars).
- Ray Train: its console log level is WARNING (``train_log_level``), which drops
  "Checkpoint successfully created" and the worker-group start-up lines; Ray Train's own
  files in the session log directory still have every level.
- The driver's Ray loggers ("ray", "ray.data", "ray.train", "ray.tune") write to
  ``<log_dir>/ray.log`` instead of the terminal, or, without a ``log_dir``, only their
  warnings reach it.
- Worker lines with Ray's colour codes would be unreadable in a file: ``RAY_COLOR_PREFIX=0``.

What Ray still prints (lines forwarded from workers, native warnings of Ray's C++ core,
error notices of dead workers) is kept off the terminal by ``ray_logs.RayOutput``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from augsbert_ray.runtime import state

# Loggers of Ray's driver-side libraries whose console output start_ray redirects.
RAY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.tune")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def quiet_ray_output(log_dir: str | os.PathLike | None = None) -> None:
    """Keeps this process's Ray messages off the terminal (``start_ray(verbose=False)`` calls it).

    Ray Data shows no progress and no "Starting execution" lines; the driver's Ray loggers
    write to ``<log_dir>/ray.log`` (without a ``log_dir``, only their warnings reach the
    terminal); Ray Train's console level becomes WARNING (``train_log_level``); forwarded
    worker lines are printed without colour codes. ``restore_ray_output`` undoes it.
    """
    state.settings.verbose = False
    state.set_env({"RAY_COLOR_PREFIX": "0"}, only_unset=True)
    _quiet_loggers(log_dir)
    _quiet_ray_data()


def restore_ray_output() -> None:
    """Undoes ``quiet_ray_output`` (and the environment ``start_ray`` set)."""
    settings = state.settings
    for logger, handler, level, removed in reversed(settings.handlers):
        handler.setLevel(level)
        if removed and handler not in logger.handlers:
            logger.addHandler(handler)
    for logger, handler in settings.added:
        logger.removeHandler(handler)
        handler.close()
    if settings.data_context:
        from ray.data import DataContext

        for name, value in settings.data_context.items():
            setattr(DataContext.get_current(), name, value)
    for name, value in settings.env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    state.settings = state.Settings()


def train_log_level() -> str:
    """The console log level of Ray Train runs (``ray.train.LoggingConfig``): INFO when
    verbose, else WARNING (Ray Train's session log files keep every level either way)."""
    return "INFO" if state.settings.verbose else "WARNING"


def _quiet_loggers(log_dir) -> None:
    """Ray's driver-side loggers write to ``<log_dir>/ray.log`` (or only warnings reach the terminal)."""
    import ray  # noqa: F401 - configures the "ray" logger
    import ray.data  # noqa: F401 - configures the "ray.data" logger

    settings = state.settings
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
                settings.handlers.append((logger, h, h.level, True))
            else:
                settings.handlers.append((logger, h, h.level, False))
                h.setLevel(max(h.level, logging.WARNING))
        if target is not None and (consoles or not logger.propagate):
            logger.addHandler(target)
            settings.added.append((logger, target))


def _quiet_ray_data() -> None:
    """No progress bars (on a non-terminal, the "Active & requested resources" blocks) and
    no per-dataset "Starting execution" lines."""
    from ray.data import DataContext
    from ray.util.debug import log_once

    ctx = DataContext.get_current()
    for name, value in (("enable_progress_bars", False), ("print_on_execution_start", False),
                        ("verbose_stats_logs", False)):
        state.settings.data_context.setdefault(name, getattr(ctx, name))
        setattr(ctx, name, value)
    log_once("ray_data_progress_manager_disabled")  # its "Progress bars disabled" notice: said here
