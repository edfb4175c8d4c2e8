"""``augsbert``: run or validate AugSBERT jobs.

    augsbert run jobs/stsb-bm25.yaml                       # the full STSb job
    augsbert run jobs/smoke.yaml bi_encoder.epochs=2       # with an override
    augsbert run jobs/stsb-bm25.yaml --fresh               # redo every stage (default: resume)
    augsbert run jobs/smoke.yaml --verbose                 # show Ray's own messages too
    augsbert report runs/smoke                             # a run's summary again, finished or not
    augsbert validate jobs/*.yaml                          # check job files, build nothing
    augsbert validate jobs/smoke.yaml sampling.top_k=5     # ... with overrides

Every error the job can foresee (``AugSBERTError``: config, data, models, training that
cannot succeed) is printed as one ``augsbert: error:`` line, exit status 2. SIGINT and
SIGTERM, wherever they arrive (also while Ray Train trains), stop the local Ray the job
started, print ``augsbert: interrupted`` and exit with 130 and 143 (``signals``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from contextlib import ExitStack

from augsbert_ray import signals
from augsbert_ray.cluster_address import choose as choose_address
from augsbert_ray.errors import AugSBERTError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="augsbert",
        description="Augmented SBERT on Ray: a cross-encoder labels sampled pairs, a bi-encoder trains on gold + silver.",
        epilog="Overrides are key.sub=value pairs applied on top of the job file, e.g. sampling.top_k=5.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="run a job end to end (resuming what an earlier run of it finished)",
        description="Run a job. A re-run resumes: stages whose inputs, config and models are unchanged and whose "
                    "outputs are intact are skipped, and labelling keeps the shards it committed.")
    run.add_argument("job", help="a job YAML file (see jobs/)")
    run.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    run.add_argument("--address", help="Ray cluster address (else ray.address in the job, else RAY_ADDRESS, else local)")
    run.add_argument("--fresh", action="store_true", help="redo every stage, ignoring what earlier runs finished")
    run.add_argument("--verbose", action="store_true",
                     help="show Ray's, Ray Data's, Ray Train's and transformers' own messages (by default they are "
                          "written to <run dir>/logs/ray.log and the terminal shows the job's progress)")
    rep = sub.add_parser("report", help="print a run's summary (the scores, the teacher check, stage times) again",
                         description="Print the summary of a finished or unfinished run, as summary.md holds it, and "
                                     "list its plots.")
    rep.add_argument("run_dir", help="a run directory (runs/NAME)")
    val = sub.add_parser("validate", help="load and validate job files without running anything")
    val.add_argument("jobs", nargs="+", metavar="JOB_OR_OVERRIDE",
                     help="job YAML files, and key.sub=value overrides applied to every file (an argument with '=' "
                          "that is not an existing file is an override)")
    val.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="an override to apply to every file")
    return p


def split_jobs_and_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Job files and ``key=value`` overrides from positional arguments, as ``run`` takes them:
    an argument holding ``=`` that is not an existing file is an override."""
    overrides = [a for a in args if "=" in a and not os.path.exists(a)]
    return [a for a in args if a not in overrides], overrides


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from augsbert_ray.config import load_job

    try:
        if args.command == "report":
            from augsbert_ray.report import show_run

            print(show_run(args.run_dir), end="")
            return 0
        if args.command == "validate":
            jobs, overrides = split_jobs_and_overrides(args.jobs)
            if not jobs:
                raise AugSBERTError(f"no job file among {args.jobs} (overrides look like key.sub=value)")
            for path in jobs:
                cfg = load_job(path, overrides + args.overrides)
                mode = (f"domain adaptation, target task {cfg.target_task}" if cfg.target is not None
                        else f"strategy {cfg.sampling.strategy}")
                print(f"{path}: ok (job '{cfg.name}', {mode}, run dir {cfg.resolved_run_dir})")
            return 0
        with signals.handled():
            # Quoted, so that the address is taken as written ("head:" would be a YAML mapping).
            overrides = list(args.overrides) + ([f"ray.address={json.dumps(args.address)}"] if args.address else [])
            cfg = load_job(args.job, overrides)
            address = choose_address(cfg.ray.address, cfg.source, args.address,
                                     overridden=any(o.startswith("ray.address=") for o in args.overrides))
            return _run(cfg, address, args.fresh, args.verbose)
    except AugSBERTError as e:
        print(f"augsbert: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("augsbert: interrupted", file=sys.stderr)
        return signals.exit_status(e)


def _run(cfg, address, fresh: bool, verbose: bool) -> int:
    """Runs a job and prints its summary. Whatever way it ends (done, an error, SIGINT,
    SIGTERM), the copies of models it unpacked are removed, the local Ray it started is
    stopped and the run directory is free for the next run.

    Before anything is loaded: the cluster address answers, the storage of a remote run
    directory answers, and the run directory can be created and is held by no other run
    (``run_lock.RunLock``, held until the job ends)."""
    from augsbert_ray.cluster_address import check as check_address
    from augsbert_ray.preflight import check_job
    from augsbert_ray.report import summary_markdown
    from augsbert_ray.run_lock import RunLock
    from augsbert_ray.rundir import check_storage, is_uri, local_root

    check_address(address)
    location = cfg.resolved_run_dir
    if is_uri(location):
        check_storage(str(location))
    with RunLock(local_root(location), shown=str(location)):
        check_job(cfg)  # every check that needs no cluster, before the job's own files (its logs) exist
        metrics = _run_watched(cfg, fresh=fresh, verbose=verbose)
    print()
    print(summary_markdown(metrics))
    return 0


def job_stages(cfg) -> list[str]:
    """The stages a job runs, in order, as the progress display counts them."""
    from augsbert_ray.pipeline import recipe

    return [stage.name for stage in recipe(cfg)]


def _run_watched(cfg, fresh: bool, verbose: bool):
    """Runs a job under the progress display; unless ``verbose``, Ray's own output goes to
    ``<run dir>/logs/ray.log`` and only the engine's lines and progress reach the terminal."""
    from augsbert_ray.artifacts import cleanup_shipped
    from augsbert_ray.pipeline import run_job
    from augsbert_ray.progress import JobProgress
    from augsbert_ray.ray_logs import RayOutput
    from augsbert_ray.rundir import local_root
    from augsbert_ray.runtime import stop_ray

    logs = local_root(cfg.resolved_run_dir) / "logs"
    engine = logging.getLogger("augsbert_ray")
    with ExitStack() as stack:
        out = None if verbose else stack.enter_context(RayOutput(logs / "ray.log"))
        stack.callback(stop_ray)  # inside the capture: Ray's shut-down messages go to the log too
        stack.callback(cleanup_shipped)  # (callbacks run last first: the copies go while Ray is up)
        progress = stack.enter_context(JobProgress(job_stages(cfg), stream=out.terminal if out else sys.stderr,
                                                   log_path=logs / "job.log", redirect_std=verbose))
        if out is not None:
            out.follow(progress.message)
            progress.message(f"[augsbert] Ray's own messages: {logs / 'ray.log'} (--verbose shows them here)")
        # The engine's own logging: warnings on the display, the rest in the job log.
        handler, level = progress.logging_handler(), engine.level
        engine.addHandler(handler)
        engine.setLevel(logging.INFO)
        stack.callback(engine.setLevel, level)
        stack.callback(engine.removeHandler, handler)
        return run_job(cfg, log=progress.message, fresh=fresh, progress=progress, verbose=verbose)


if __name__ == "__main__":
    sys.exit(main())
