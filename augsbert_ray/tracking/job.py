"""A job's tracking run: opened with the job, fed training points as they arrive, closed with its results."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

from augsbert_ray.tracking.points import receiving
from augsbert_ray.tracking.records import config_params, run_metrics, run_tags

log = logging.getLogger(__name__)


def tracking_info(cfg, root: Path) -> dict[str, str]:
    """Where a job's tracking goes and how to look at it ({} for backend none).

    Args:
        cfg: the job.
        root: the run directory's local root (``RunDir.root``).

    Returns:
        ``backend``, ``uri`` (MLflow's tracking URI or TensorBoard's log directory), ``experiment``
        and ``command``: the command that shows the runs.
    """
    t = cfg.tracking
    experiment = t.experiment or cfg.name
    if t.backend == "mlflow":
        uri = t.uri or (Path(root).absolute() / "mlruns").as_uri()
        # MLflow 3 opens a file store only when allowed (the job allows its own: backends.file_store_allowed)
        allow = "MLFLOW_ALLOW_FILE_STORE=true " if uri.startswith("file:") else ""
        return {"backend": "mlflow", "uri": uri, "experiment": experiment,
                "command": f"{allow}mlflow ui --backend-store-uri {uri}"}
    if t.backend == "tensorboard":
        logdir = Path(t.uri).expanduser() if t.uri else Path(root).absolute() / "tensorboard"
        return {"backend": "tensorboard", "uri": str(logdir), "experiment": experiment,
                "command": f"tensorboard --logdir {logdir}"}
    return {}


class JobTracker:
    """Writes a job's records to a tracking run (``backends``), the training points as they
    arrive while the job runs (``receive``, ``points``).

    Thread-safe: points arrive on the progress channel's thread while stages run in others.
    """

    def __init__(self, backend):
        self.backend = backend
        self._lock = threading.Lock()
        self.points = 0

    def receive(self, point: dict) -> None:
        """Records a training's loss and learning rate at one step (``train/<model>/loss``, ``lr``)."""
        model = point.get("model", "model")
        values = {f"train/{model}/{k}": point[k] for k in ("loss", "lr") if isinstance(point.get(k), (int, float))}
        if not values:
            return
        try:
            with self._lock:
                self.backend.metrics(values, int(point.get("step", 0)))
                self.points += 1
        except Exception as e:  # noqa: BLE001 - a tracking store that fails must not fail the job
            self._failed(e)

    def start(self, cfg) -> None:
        """Records the job's config (as it runs: after the autopilot's choice) as parameters."""
        self._call(lambda: self.backend.params(config_params(cfg.model_dump(mode="json"))))

    def finish(self, metrics, published: Mapping[str, str], root: Path) -> None:
        """Records the run's results (``records``), ``summary.md`` and the published models' folders."""
        root = Path(root)

        def write():
            self.backend.metrics(run_metrics(metrics), 0)
            self.backend.tags(run_tags(metrics))
            summary = root / "summary.md"
            if summary.is_file():
                self.backend.text("summary.md", summary.read_text(encoding="utf-8"))
            for rel in sorted(set(published.values())):
                if (root / rel).is_dir():
                    self.backend.folder(root / rel, rel)

        self._call(write)

    def close(self, status: str) -> None:
        self._call(lambda: self.backend.close(status))

    def _call(self, fn) -> None:
        try:
            with self._lock:
                fn()
        except Exception as e:  # noqa: BLE001 - see receive
            self._failed(e)

    def _failed(self, e: Exception) -> None:
        log.warning(f"[tracking] WARNING: {self.backend.where}: could not record: {type(e).__name__}: {e}")


class NoTracking:
    """backend none: records nothing."""

    def start(self, cfg) -> None:
        pass

    def finish(self, metrics, published, root) -> None:
        pass


@contextmanager
def job_tracking(cfg, root: Path) -> Iterator[JobTracker | NoTracking]:
    """A job's tracking run while the context lasts: ``FINISHED`` when it ends, ``FAILED`` (or
    ``KILLED`` on Ctrl-C) when it raises. The training points the driver is handed meanwhile
    are recorded (``points.receiving``).

    Args:
        cfg: the job; ``cfg.tracking`` says where to.
        root: the run directory's local root.
    """
    from augsbert_ray.tracking.backends import MlflowRun, TensorBoardRun, file_store_allowed

    info = tracking_info(cfg, root)
    if not info:
        yield NoTracking()
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with file_store_allowed(info["uri"] if info["backend"] == "mlflow" else ""):
        try:
            if info["backend"] == "mlflow":
                backend = MlflowRun(info["uri"], info["experiment"], run_name=f"{cfg.name} {stamp}",
                                    tags={"job": cfg.name, "run_dir": str(root), "job_file": str(cfg.source or "")})
            else:
                backend = TensorBoardRun(Path(info["uri"]) / info["experiment"] / stamp)
        except Exception as e:  # noqa: BLE001 - whatever the library raises, named as the setting's
            from augsbert_ray.errors import ConfigError

            key = "tracking.uri" if cfg.tracking.uri else "tracking.backend"
            why = str(e).splitlines()[0] if str(e) else ""
            raise ConfigError(cfg.source, key, f"cannot open {info['backend']} at {info['uri']}: "
                                               f"{type(e).__name__}: {why}") from None
        log.info(f"[augsbert] tracking: {backend.where}; view with: {info['command']}")
        tracker = JobTracker(backend)
        with receiving(tracker.receive):
            try:
                yield tracker
            except KeyboardInterrupt:
                tracker.close("KILLED")
                raise
            except BaseException:
                tracker.close("FAILED")
                raise
            tracker.close("FINISHED")
