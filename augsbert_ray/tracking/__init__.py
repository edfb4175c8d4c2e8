"""Experiment tracking: a job recorded in MLflow or TensorBoard (``tracking.backend`` of a job).

The driver alone writes the records. What the job measured comes from its typed results once
it ends (``records``); each training's loss and learning rate at every logged step come from
the training loop's log records, which rank 0 of Ray Train (or the warm host) sends through the
job's progress channel like its other lines and the driver hands them to the tracker
(``points``), so workers never import a tracking library. ``backends`` holds the two writers.

    with job_tracking(cfg, rd.root) as tracker:   # does nothing for backend none
        ...
        tracker.start(cfg)                         # the config as run (after the autopilot's choice)
        metrics = finish(...)
        tracker.finish(metrics, published, rd.root)
"""

from augsbert_ray.tracking.job import JobTracker, job_tracking, tracking_info

__all__ = ["JobTracker", "job_tracking", "tracking_info"]
