"""One progress display for a job: which stage of how many, a bar per stage, and ETAs.

- ``display``: ``JobProgress`` (bars on a terminal, plain timestamped lines elsewhere),
  ``StageProgress`` (what code doing a stage's work reports to) and ``DisplayHandler`` (the
  display as the engine's logging handler)
- ``eta``: the stages' state and the job's ETA, pure
- ``render``: the bars (rich)
- ``joblog``: the dated job log (``<run dir>/logs/job.log``)
- ``channel``: progress from Ray workers to the display (a sink actor, a picklable handle)
- ``messages``: the engine's lines as Python logging under the ``augsbert_ray`` logger
- ``ray_logs``: Ray's own output into ``<run dir>/logs/ray.log``, the events that matter translated

Workers in other processes report through ``channel`` (a Ray actor); in the
driver, code reports to a stage directly, e.g. ``progress.stage("silver").advance(512)``.

Example::

    with JobProgress(["cross_encoder", "gold_only", "silver"], log_path=run / "logs/job.log") as p:
        p.plan("gold_only", total=120, unit="steps", rate_key="bi-encoder step")
        p.start_stage("cross_encoder", total=120, unit="steps")
        for _ in range(120):
            p.advance("cross_encoder")
        p.finish_stage("cross_encoder")
        p.finish_stage("gold_only", 0.0, reused=True)   # skipped: complete in an earlier run
        p.message("[silver] 3 of 10 shards labelled by an earlier run")
"""

from augsbert_ray.progress.display import (
    DisplayHandler,
    JobProgress,
    StageProgress,
    log_event,
)
from augsbert_ray.progress.eta import format_duration

__all__ = ["DisplayHandler", "JobProgress", "StageProgress", "format_duration", "log_event"]
