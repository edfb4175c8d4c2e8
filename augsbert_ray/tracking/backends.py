"""The two tracking writers, MLflow and TensorBoard, behind one small interface.

Each is opened by the driver once per invocation of a job and imports its library only then:
``mlflow`` (the ``mlflow`` extra: mlflow-skinny's client suffices) and ``tensorboard`` (the
``tensorboard`` extra: its event file writer and protos; no torch and no TensorFlow).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

PARAM_MAX = 6000  # characters of an MLflow parameter's value (MLflow 2 and later)


class MlflowRun:
    """One MLflow run, written through ``MlflowClient`` (MLflow's global state is left alone).

    Args:
        uri: the tracking URI (a file store ``file:///...``, ``sqlite:///...``, ``http://...``).
        experiment: the experiment's name (created if new).
        run_name, tags: the run's name and tags at its start.
    """

    def __init__(self, uri: str, experiment: str, run_name: str, tags: Mapping[str, str]):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags)).info.run_id
        self.where = f"MLflow run {self.run_id} (experiment {experiment!r}, {uri})"

    def params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:PARAM_MAX]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def metrics(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, int(step)) for k, v in values.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i:i + 1000])

    def tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        if tags:
            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def text(self, name: str, text: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def folder(self, folder: Path, path: str) -> None:
        self.client.log_artifacts(self.run_id, str(folder), path)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


class TensorBoardRun:
    """Event files in ``logdir`` (one folder per invocation of the job): scalars by tag and step,
    texts (the config, the stages, summary.md, the models' folders) as TensorBoard's text plugin shows them."""

    def __init__(self, logdir: Path):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = Path(logdir)
        self.writer = EventFileWriter(str(self.logdir))
        self.where = f"TensorBoard event files in {self.logdir}"
        self._tags: dict[str, str] = {}

    def _summary(self, summary, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self.writer.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def params(self, params: Mapping[str, str]) -> None:
        rows = "\n".join(f"| {k} | {_cell(v)} |" for k, v in params.items())
        self.text("config", f"| setting | value |\n|---|---|\n{rows}")

    def metrics(self, values: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._summary(Summary(value=[Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]), step)

    def tags(self, tags: Mapping[str, str]) -> None:
        self._tags.update({k: str(v) for k, v in tags.items()})

    def text(self, name: str, text: str) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb

        self._summary(text_pb(name, text), 0)

    def folder(self, folder: Path, path: str) -> None:
        self.tags({f"artifact.{path}": str(Path(folder).absolute())})

    def close(self, status: str) -> None:
        self.tags({"status": status})
        rows = "\n".join(f"| {k} | {_cell(v)} |" for k, v in sorted(self._tags.items()))
        self.text("tags", f"| tag | value |\n|---|---|\n{rows}")
        self.writer.close()


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


@contextmanager
def file_store_allowed(uri: str) -> Iterator[None]:
    """MLflow 3 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE`` is set; the job's own
    store under the run directory needs no database, so it is allowed while the job writes it."""
    if not uri.startswith("file:"):
        yield
        return
    was = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if was is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = was
