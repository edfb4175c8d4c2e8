"""Experiment tracking: where a job records its settings, training curves, scores and models."""

from __future__ import annotations

from typing import Literal

from augsbert_ray.config.fields import Section, placement

BACKEND_DOC = (
    "none: the run directory's metrics.json and summary.md only. mlflow: an MLflow run per invocation of the job "
    "(its config as parameters; each training's loss and learning rate at every logged step; every model's dev and "
    "test scores; stage times and fixed costs; the teacher check and the shipping decision; summary.md and the "
    "published models as artifacts), by default in a file store under the run directory (<run dir>/mlruns), no "
    "server needed; needs the mlflow extra. tensorboard: the same records as TensorBoard event files under "
    "<run dir>/tensorboard (the models' folders named in a text summary); needs the tensorboard extra. Stages "
    "reused from an earlier run are marked as such, their trainings not logged again")


class TrackingConfig(Section):
    """Experiment tracking. Nothing here changes a result: every key is a placement setting."""

    backend: Literal["none", "mlflow", "tensorboard"] = placement("none", description=BACKEND_DOC)
    uri: str | None = placement(
        None, description="mlflow: a tracking URI (http://host:5000, sqlite:///mlflow.db, file:///path); null: the "
                          "file store <run dir>/mlruns. tensorboard: the log directory; null: <run dir>/tensorboard")
    experiment: str | None = placement(
        None, description="mlflow: the experiment's name; tensorboard: the log directory's subfolder; null: the "
                          "job's name")
