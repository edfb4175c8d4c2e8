"""``augsbert``: run or validate AugSBERT jobs.

    augsbert run jobs/stsb-bm25.yaml                       # the full STSb job
    augsbert run jobs/smoke.yaml bi_encoder.epochs=2       # with an override
    augsbert run jobs/stsb-bm25.yaml --fresh               # redo every stage (default: resume)
    augsbert run jobs/stsb-bm25.yaml --until cross_encoder # only the teacher and what it needs
    augsbert run jobs/smoke.yaml --verbose                 # show Ray's own messages too
    augsbert report runs/smoke                             # a run's summary again, finished or not
    augsbert validate jobs/*.yaml                          # check job files, build nothing
    augsbert validate jobs/smoke.yaml sampling.top_k=5     # ... with overrides
    augsbert validate --explain jobs/smoke.yaml            # every setting: value, default, meaning
    augsbert label MODEL pairs/*.parquet --out scored/     # score pair files with a cross-encoder
    augsbert bench --quick --out bench/                    # measure this cluster beside its peers
    augsbert data fetch stsb                               # download the STS benchmark, checked by sha256

Every error the job can foresee (``AugSBERTError``: config, data, models, training that
cannot succeed) is printed as one ``augsbert: error:`` line, exit status 2. An error it did
not foresee, inside a stage, is one line too, naming the stage and the log that holds its
traceback (``<run dir>/logs/job.log``), exit status 1; ``--verbose`` prints the traceback. SIGINT and
SIGTERM, wherever they arrive (also while Ray Train trains), stop the local Ray the job
started, print ``augsbert: interrupted`` and exit with 130 and 143 (``signals``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from augsbert_ray import signals
from augsbert_ray.cluster_address import for_job as address_for_job
from augsbert_ray.errors import AugSBERTError, as_disk_full


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
    run.add_argument("job", nargs="?", help="a job YAML file (see jobs/)")
    run.add_argument("overrides", nargs="*", default=[], help="key.sub=value overrides (before or after the flags)")
    run.add_argument("--address", help="Ray cluster address (else ray.address in the job, else RAY_ADDRESS, else local)")
    run.add_argument("--fresh", action="store_true", help="redo every stage, ignoring what earlier runs finished")
    run.add_argument("--until", metavar="STAGE",
                     help="run only STAGE and the stages it depends on (e.g. --until cross_encoder trains and "
                          "scores nothing but the teacher); a later run resumes from there")
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
    val.add_argument("--explain", action="store_true",
                     help="also print every setting of each job: its value, its default and what it does")
    _label_parser(sub)
    _data_parser(sub)
    from augsbert_ray.bench.command import add_parser as bench_parser

    bench_parser(sub)
    return p


def _label_parser(sub) -> None:
    lab = sub.add_parser(
        "label", help="score pair files with a cross-encoder on the cluster (resumable)",
        description="Score sentence pairs with a cross-encoder through the labelling pipeline of the silver stage. "
                    "OUT gets Parquet parts with every input column and the score; a re-run into it resumes, "
                    "scoring no committed shard again.")
    lab.add_argument("model", help="the cross-encoder: embedded, a Hugging Face id or a local folder")
    lab.add_argument("pairs", nargs="+",
                     help="Parquet, JSON lines, CSV or TSV files, folders or globs (local or s3://)")
    lab.add_argument("--out", required=True, help="the output folder")
    lab.add_argument("--columns", help="the sentence columns, e.g. sentence1=question,sentence2=answer "
                                       "(default: sentence1, sentence2)")
    lab.add_argument("--format", choices=["parquet", "jsonl", "csv", "tsv"], help="every file's format "
                                                                                 "(default: by extension)")
    lab.add_argument("--score-column", default="score", help="the output's score column (default: score)")
    lab.add_argument("--max-length", type=int, default=128, help="token limit of a pair (default: 128)")
    lab.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16", "int8"],
                     help="as labeling.precision (default: auto)")
    lab.add_argument("--token-budget", type=int, default=0, help="as labeling.token_budget (0: by device)")
    lab.add_argument("--num-gpus", type=float, default=0, help="GPUs per actor (default: 0, on CPU)")
    lab.add_argument("--actors", type=int, help="labelling actors (default: one per GPU, or one on CPU)")
    lab.add_argument("--block-size", type=int, default=0, help="pairs per committed shard (0: by device)")
    lab.add_argument("--address", help="Ray cluster address (else RAY_ADDRESS, else local)")
    lab.add_argument("--fresh", action="store_true", help="start OUT over if it holds an earlier labelling")
    lab.add_argument("--verbose", action="store_true", help="show Ray's own messages")


def _data_parser(sub) -> None:
    data = sub.add_parser("data", help="get the public datasets the shipped jobs read",
                          description="Get the public datasets the shipped jobs read.")
    verbs = data.add_subparsers(dest="data_command", required=True)
    fetch = verbs.add_parser(
        "fetch", help="download a dataset from its original source, checked by sha256",
        description="Download a dataset from its original source, check every file against the sha256 of the copy "
                    "the project is tested on, and move the files into place only once all are verified. Files "
                    "already in place and verified are not downloaded again.")
    fetch.add_argument("dataset", choices=["stsb", "mrpc"], help="stsb: the STS benchmark; mrpc: the Microsoft "
                                                                 "Research Paraphrase Corpus")
    fetch.add_argument("--to", metavar="DIR", help="the data directory (default: $AUGSBERT_DATA_DIR, else "
                                                   "~/.cache/augsbert-ray/data, where the shipped jobs look)")
    fetch.add_argument("--mirror", metavar="URL", help="a base URL serving the same files under the same names, "
                                                       "instead of the original hosts")


def split_jobs_and_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Job files and ``key=value`` overrides from positional arguments, as ``run`` takes them:
    an argument holding ``=`` that is not an existing file is an override."""
    overrides = [a for a in args if "=" in a and not os.path.exists(a)]
    return [a for a in args if a not in overrides], overrides


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    # argparse ends a positional list at the first flag: overrides after one arrive here.
    stray = [a for a in extra if args.command != "run" or a.startswith("-") or "=" not in a]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if args.command == "run":
        args.overrides = [*args.overrides, *extra]
        if args.job is None:
            print("augsbert: error: no job file: augsbert run JOB.yaml [key.sub=value ...] (jobs/ holds examples)",
                  file=sys.stderr)
            return 2
    from augsbert_ray.config import explain, load_job

    try:
        if args.command == "report":
            from augsbert_ray.report import show_run

            print(show_run(args.run_dir), end="")
            return 0
        if args.command == "validate":
            jobs, overrides = split_jobs_and_overrides(args.jobs)
            if not jobs:
                raise AugSBERTError(f"no job file among {args.jobs} (overrides look like key.sub=value)")
            from augsbert_ray.preflight import check_for_validate

            for path in jobs:
                cfg = load_job(path, overrides + args.overrides)
                # what run refuses before Ray starts, validate refuses too (or says what it could not check)
                not_checked = check_for_validate(cfg, warn=lambda line: print(f"augsbert: warning: {line}",
                                                                             file=sys.stderr))
                mode = (f"domain adaptation, target task {cfg.target_task}" if cfg.target is not None
                        else f"strategy {cfg.sampling.strategy}")
                print(f"{path}: ok (job '{cfg.name}', {mode}, run dir {cfg.resolved_run_dir})")
                for what in not_checked:
                    print(f"  not checked: {what}")
                if args.explain:
                    print(explain(cfg))
            return 0
        if args.command == "data":
            from augsbert_ray.data_fetch import fetch

            fetch(args.dataset, args.to, mirror=args.mirror)
            return 0
        if args.command == "label":
            with signals.handled():
                return _label(args)
        if args.command == "bench":
            from augsbert_ray.bench.command import main as bench

            with signals.handled():
                return bench(args, sys.argv[1:] if argv is None else argv)
        with signals.handled():
            # Quoted, so that the address is taken as written ("head:" would be a YAML mapping).
            overrides = list(args.overrides) + ([f"ray.address={json.dumps(args.address)}"] if args.address else [])
            cfg = load_job(args.job, overrides)
            cfg, address = address_for_job(cfg, args.address, args.overrides)
            return _run(cfg, address, args.fresh, args.verbose, args.until)
    except AugSBERTError as e:
        print(f"augsbert: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, met by a write outside the engine's own (a library's)
        full = as_disk_full(e)
        if full is None:
            raise
        print(f"augsbert: error: {full}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("augsbert: interrupted", file=sys.stderr)
        return signals.exit_status(e)


def _run(cfg, address, fresh: bool, verbose: bool, until: str | None = None) -> int:
    """Runs a job and prints its summary. Whatever way it ends (done, an error, SIGINT,
    SIGTERM), the copies of models it unpacked are removed, the local Ray it started is
    stopped and the run directory is free for the next run (``api.run``)."""
    from augsbert_ray.api import run
    from augsbert_ray.report import summary_markdown

    from augsbert_ray.rundir import local_root

    try:
        metrics = run(cfg, fresh=fresh, verbose=verbose, address=address, until=until)
    except (AugSBERTError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - reported in one line; its traceback is in the job log
        return _unforeseen(e, local_root(cfg.resolved_run_dir) / "logs" / "job.log", verbose)
    print()
    print(summary_markdown(metrics))
    return 0


def _label(args) -> int:
    from augsbert_ray.api import label

    from augsbert_ray.labeling.output import LOGS

    try:
        summary = label(args.model, args.pairs, args.out, columns=args.columns, format=args.format,
                        score_column=args.score_column, max_length=args.max_length, precision=args.precision,
                        token_budget=args.token_budget, num_gpus=args.num_gpus, actors=args.actors,
                        block_size=args.block_size, address=args.address, fresh=args.fresh, verbose=args.verbose)
    except (AugSBERTError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - reported in one line; its traceback is in the label log
        return _unforeseen(e, Path(args.out) / LOGS / "label.log", args.verbose, stage="label")
    print(f"{summary.pairs} pairs scored into {summary.out} ({summary.shards} shards, {summary.reused_shards} from "
          f"an earlier run); this run scored {summary.labelled_pairs} pairs at {summary.pairs_per_s:.1f} pairs/s")
    return 0


def _unforeseen(e: Exception, log: Path, verbose: bool, stage: str | None = None) -> int:
    """An error the engine did not foresee (a bug, a library's fault), in one line naming its
    stage and the log that holds its traceback; with ``verbose``, or before the log exists,
    the traceback itself."""
    from augsbert_ray.errors import stage_of

    full = as_disk_full(e)
    if full is not None:  # foreseen after all: a library's write met a full disk
        raise full from e
    if verbose or not log.is_file():
        raise e
    where = stage_of(e) or stage
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    print(f"augsbert: error: {f'stage {where!r}' if where else 'the job'} failed: {type(e).__name__}"
          f"{': ' + text if text else ''}; the full traceback is in {log} (--verbose shows it here)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
