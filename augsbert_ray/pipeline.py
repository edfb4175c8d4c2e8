"""The AugSBERT job, in the paper's order (Thakur et al., NAACL 2021, sections 3 and 5).

``recipe`` lists the stages of a job; ``run_job`` runs them with a ``runner.Runner`` as a
graph (a stage starts once the stages it reads from are done), which skips the stages an
earlier run finished with the same fingerprint, and writes the report. With the autopilot,
its search (``stages.auto.choose``) runs first and the job is the chosen config's recipe.
What each stage reads, writes and publishes is declared in its module (``augsbert_ray.stages``).
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import nullcontext
from typing import Callable

from augsbert_ray import graph
from augsbert_ray.config import JobConfig, dump_job
from augsbert_ray.context import JobContext
from augsbert_ray.errors import ConfigError, tag_stage
from augsbert_ray.progress.messages import lines_to
from augsbert_ray.metrics import RunMetrics
from augsbert_ray.preflight import check_models, check_paths
from augsbert_ray.rundir import RunDir
from augsbert_ray.runner import Done, Runner, stage_graph
from augsbert_ray.stages import (AugSBERT, AutoPilot, Calibrate, Candidates, Evaluate, Gold, GoldOnly, Pilot, Ship,
                                 Silver, Stage, TargetGold, TargetSets, Teacher, TeacherCheck, source_of)
from augsbert_ray.stages.gold import has_upper_bound

log = logging.getLogger(__name__)


def recipe(cfg: JobConfig, search: dict | None = None) -> list[Stage]:
    """The stages of a job, in an order that runs them one after another (the runner starts each
    as soon as the stages it reads from are done): the paper's steps, one line each.

    Args:
        cfg: the job as it runs (with the autopilot, the setting it chose).
        search: the autopilot's record (``stages.auto.choose``), kept as the ``auto`` stage.
    """
    adapting = cfg.target is not None
    return [
        Gold(),  # gold pairs (and below, target sets), loaded and checked before Ray starts
        *([TargetSets()] if adapting else []),  # domain adaptation: target pairs and test sets
        *([AutoPilot(search)] if search is not None else []),  # the settings below, chosen on dev by pilots
        Teacher(), Evaluate("cross_encoder"),  # step 1: cross-encoder on gold
        Evaluate("zero_shot"),  # reference: the untrained bi-encoder
        GoldOnly(), Evaluate("gold_only"),  # reference: bi-encoder on gold only
        *([TargetGold(), Evaluate("target_gold")] if has_upper_bound(cfg) else []),  # upper bound
        TeacherCheck(),  # AugSBERT helps only if the teacher beats gold-only on dev
        Candidates(source_of(cfg)),  # step 2.1: unlabelled pairs
        Silver(),  # step 2.2: the cross-encoder labels them
        *([Calibrate()] if cfg.labeling.calibration != "none" else []),  # the labels on the gold scale
        *([Pilot()] if cfg.evaluation.pilot else []),  # do the labels help? a short trial
        AugSBERT(), Evaluate("augsbert"),  # step 3: bi-encoder on gold + silver
        Ship(),  # the better of AugSBERT and gold only on dev (or AugSBERT, as configured)
    ]


def stage_names(cfg: JobConfig, until: str | None = None, stages: list[Stage] | None = None) -> list[str]:
    """The names of a job's stages as far as they are known before it runs (the autopilot's
    choice can add the calibration); with ``until``, only those ``through`` keeps.

    Args:
        stages: ``recipe(cfg)``, when the caller has it.

    Raises:
        ConfigError: ``until`` names no stage of the job.
    """
    stages = recipe(cfg) if stages is None else stages
    names = [s.name for s in stages]
    if cfg.auto.enabled:
        names.insert(2 if cfg.target is not None else 1, "auto")
    if until is None:
        return names
    if until not in names:
        raise ConfigError(cfg.source, None, f"no stage '{until}' to run until; the job's stages: {', '.join(names)}")
    kept = {s.name for s in through(cfg, stages, until)}
    return [n for n in names if n in kept or n == "auto"]


def through(cfg: JobConfig, stages: list[Stage], until: str) -> list[Stage]:
    """``until`` and the stages it depends on, directly or not (it reads their outputs or
    follows them), in ``stages``' order: what a job run ``until`` a stage runs. The loading
    stages and the autopilot's record of its choice are kept too: they ran before the choice."""
    deps = stage_graph(cfg, stages)
    keep = graph.upstream(deps, [until]) if until in deps else {until}  # "auto" before the choice
    return [s for s in stages if s.name in keep or s.name == "auto" or s.loads]


def run_job(cfg: JobConfig, log: Callable[[str], None] | None = None, fresh: bool = False, until: str | None = None,
            on_stage: Callable[[Done], None] | None = None,
            on_start: Callable[[str], None] | None = None, progress=None, verbose: bool = True, inputs=None,
            stages: list[Stage] | None = None) -> RunMetrics:
    """Runs one AugSBERT job and returns its metrics (also written to the run directory).

    With ``auto.enabled`` the autopilot first chooses the job's setting (``stages.auto.choose``);
    the job then runs the chosen setting's recipe as a graph (``runner.Runner.run_graph``):
    each stage starts once the stages it reads from are done, independent ones at once where
    the cluster has room.

    A re-run resumes: stages an earlier run completed with the same fingerprint (outputs
    intact) are skipped, an interrupted stage resumes inside its own folder, and a job whose
    stages are all done never starts Ray.

    Args:
        cfg: the job.
        log: deprecated: the job's lines are logged (``messages``: the ``augsbert_ray`` logger);
            a callable given here still receives them while the job runs.
        fresh: redo every stage, ignoring what earlier runs finished.
        until: run only the stage of this name (e.g. ``cross_encoder``) and the stages it
            depends on (``through``); the metrics then hold what ran (``complete`` is False).
        on_stage: called with each stage's outcome as it finishes.
        on_start: called with a stage's name when it starts running (not when it is reused).
        progress: the job's display (``progress.JobProgress``); None: log lines only.
        verbose: False keeps Ray's own messages off the terminal, in ``<run dir>/logs/ray.log``
            (``runtime.start_ray``).
        inputs: what the job's pre-flight checks (``preflight.check_job``) found and read
            (``loaders.job_inputs.JobInputs``): the paths and models are not checked again and
            the gold and target sets are not read again. None: the paths and models are
            checked here.
        stages: ``recipe(cfg)``, when the caller built it already.
    """
    if log is not None:
        warnings.warn("run_job(log=...) is deprecated: the job's lines are logged to the 'augsbert_ray' logger; "
                      "add a logging handler to receive them", DeprecationWarning, stacklevel=2)
    with lines_to(log) if log is not None else nullcontext():
        return _run_job(cfg, fresh, until, on_stage, on_start, progress, verbose, inputs,
                        recipe(cfg) if stages is None else stages)


def _run_job(cfg: JobConfig, fresh: bool, until: str | None, on_stage, on_start, progress, verbose: bool, inputs,
             stages: list[Stage]) -> RunMetrics:
    if inputs is None:  # not checked yet: before anything is written, the input files and model folders are there
        check_paths(cfg)
        check_models(cfg)
    rd = RunDir(cfg.resolved_run_dir)
    job = cfg

    def claim():  # the run directory holds this job's work from its first stage on
        rd.write_text("config.yaml", dump_job(job))
        log.info(f"[augsbert] job '{job.name}': run directory {rd.location}"
                 + (f" (staged locally in {rd.root})" if rd.uri else ""))

    ctx = JobContext(start=lambda: _start_cluster(cfg, rd, verbose), progress=progress,
                     track=cfg.tracking.backend != "none", inputs=inputs)
    runner = Runner(cfg, rd, fresh=fresh, ctx=ctx, on_stage=on_stage, on_start=on_start, on_claim=claim,
                    progress=progress)
    wanted = set(stage_names(cfg, until, stages))  # an unknown stage fails here, before anything is written
    from augsbert_ray.tracking import job_tracking

    with job_tracking(cfg, rd.root) as tracker:
        metrics = _run_stages(cfg, runner, rd, tracker, until, wanted, progress, stages)
    if cfg.tracking.backend != "none" and rd.uri:
        rd.push()  # the tracking files written under the run directory since the report's push
    return metrics


def _run_stages(cfg: JobConfig, runner: Runner, rd: RunDir, tracker, until: str | None, wanted: set[str],
                progress, stages: list[Stage]) -> RunMetrics:
    from augsbert_ray.report import finish

    try:
        if cfg.auto.enabled:
            from augsbert_ray.stages.auto import choose

            if progress is not None:
                progress.start_stage("auto")
            try:
                choice = choose(cfg, runner, recipe, progress=runner.reporter("auto", local=True))
            except BaseException as e:
                tag_stage(e, "auto")  # (a stage the autopilot ran has named itself already)
                raise
            runner.cfg = cfg = choice.cfg  # the job runs the setting the autopilot chose
            stages = recipe(cfg, choice.record)  # the chosen setting's stages
        tracker.start(cfg)  # the config as it runs
        names = [s.name for s in stages]
        if until is None:
            todo = stages
        elif until in names:
            todo = through(cfg, stages, until)
        else:  # the chosen setting lacks it (a calibration the search left out): what it would have needed
            todo = [s for s in stages if s.name in wanted]
        runner.expect(todo)

        def report_so_far(stage, done):  # so that an unfinished run has a report too (augsbert report)
            # The silver density plot is drawn again when a stage wrote silver labels.
            finish(cfg, runner, stages, complete=False, plot="silver.parquet" in done.outputs, quiet=True)

        runner.run_graph(todo, after=report_so_far)
        metrics = finish(cfg, runner, stages, complete=len(todo) == len(stages))
        tracker.finish(metrics, {stage: out["model"] for stage, out in runner.published.items() if "model" in out},
                       rd.root)
        return metrics
    finally:
        runner.ctx.close()  # the job's warm hosts and progress channel end with it


def plan(cfg: JobConfig, run_dir=None) -> dict[str, str]:
    """Every stage's fingerprint for ``cfg``, running nothing but the loading of its inputs.

    Two configs whose plans differ for a stage would run it separately; equal ones share it.
    """
    rd = RunDir(run_dir or cfg.resolved_run_dir)
    return Runner(cfg, rd).plan(recipe(cfg))


def _start_cluster(cfg: JobConfig, rd: RunDir, verbose: bool = True):
    from augsbert_ray.models import TRUST_REMOTE_CODE_ENV
    from augsbert_ray.preflight.resource_checks import check_cluster_gpus, runs_locally
    from augsbert_ray.runtime import start_ray

    # Only a job that trusts remote code sets the flag for its workers (and its runtime env).
    os.environ.pop(TRUST_REMOTE_CODE_ENV, None)
    env = {TRUST_REMOTE_CODE_ENV: "1"} if cfg.trust_remote_code else None
    if cfg.trust_remote_code:
        log.warning("[augsbert] WARNING: trust_remote_code is on: Python code shipped with the configured models "
                    "will run on the driver and every Ray worker. Use it only for models whose code you trust.")
    local = runs_locally(cfg)  # asked before Ray starts: afterwards this process has joined it
    cluster = start_ray(cfg.ray.address, cfg.ray.num_cpus, env_vars=env, verbose=verbose,
                        log_dir=None if verbose else rd.path("logs"))
    if not local:  # a local run's GPUs were checked before Ray started
        check_cluster_gpus(cfg, cluster.gpus, cfg.ray.address)
    log.info(f"[augsbert] Ray cluster: {cluster.describe()}")
    if cluster.logs or cluster.dashboard:
        log.info(f"[augsbert] Ray logs: {cluster.logs or 'see the cluster'}; dashboard: "
                 f"{cluster.dashboard or 'not started'} (bound to the head; reach it by SSH tunnel)")
    return cluster
