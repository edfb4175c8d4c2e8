"""What the ``augsbert`` verbs do, as Python functions for notebooks and Ray job scripts.

The CLI is a thin layer over these; ``augsbert_ray`` exports them (``augsbert_ray.run``...).

Example::

    import augsbert_ray

    job = augsbert_ray.load_job("jobs/smoke.yaml", ["bi_encoder.epochs=2"])
    metrics = augsbert_ray.run(job)  # resumes what an earlier run of the job finished
    print(metrics.scores)

    summary = augsbert_ray.label("runs/smoke/models/cross-encoder", ["pairs.csv"], "scored/",
                                 columns={"sentence1": "question", "sentence2": "answer"})
    print(summary.pairs, summary.pairs_per_s)

    report = augsbert_ray.bench("bench-out", quick=True, parts=["bm25", "control-plane"])
    print(report.part("control-plane").data["ceiling"])

Each function starts a local Ray (or joins the cluster it is given, or one that this
process already joined) and leaves Ray as it found it.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["load_job", "run", "label", "bench"]


def load_job(path: str | os.PathLike, overrides: Sequence[str] = ()):
    """Loads and validates a job file, as ``augsbert validate`` does.

    Args:
        path: a job YAML file (see ``jobs/``).
        overrides: ``key.sub=value`` strings applied on top of the file (one string is one override).

    Returns:
        The job's ``config.JobConfig``.

    Raises:
        ConfigError: unreadable YAML, unknown or invalid keys (naming the file and the key).
        ArgumentTypeError: an argument of the wrong type (also a ``TypeError``).
    """
    from augsbert_ray.api_arguments import PATH, require, strings
    from augsbert_ray.config import load_job as _load

    require("load_job", "path", path, PATH, "a job file's path (str or path)")
    return _load(path, strings("load_job", "overrides", overrides, "key.sub=value strings", optional=True) or [])


def run(job, fresh: bool = False, *, verbose: bool = False, address=None, until: str | None = None):
    """Runs a job end to end, as ``augsbert run`` does, and returns its metrics.

    A re-run resumes: stages whose inputs, config and models are unchanged are skipped.
    Progress goes to stderr (bars on a terminal, plain lines elsewhere) and to
    ``<run dir>/logs/job.log``. Unless ``verbose``, Ray's own messages go to
    ``<run dir>/logs/ray.log`` (when stderr is the process's own, as in a script; in a
    notebook they are shown).

    Args:
        job: a ``JobConfig`` (``load_job``) or the path of a job file.
        fresh: redo every stage, ignoring what earlier runs finished.
        verbose: show Ray's, Ray Data's, Ray Train's and transformers' own messages.
        address: a Ray address, or a ``cluster_address.AddressChoice`` saying where it was
            given (default: the job's ``ray.address``, else ``RAY_ADDRESS``, else a local Ray).
        until: run only this stage (e.g. ``cross_encoder``) and the stages it depends on; the
            metrics then say the run is not complete, and a later run resumes from there.

    Before anything is loaded, the cluster address must answer, the storage of a remote run
    directory must answer, and the run directory must be held by no other run: it is claimed
    (``run_lock.RunLock``) until the job ends.

    Returns:
        The run's ``metrics.RunMetrics`` (also in ``<run dir>/metrics.json``).

    Raises:
        AugSBERTError: anything the job can foresee (config, data, models, training that
            cannot succeed), before Ray starts where it can be known then; an argument of the
            wrong type (``ArgumentTypeError``, also a ``TypeError``).
    """
    from augsbert_ray.api_arguments import check_run
    from augsbert_ray.cluster_address import check, for_job
    from augsbert_ray.pipeline import recipe, stage_names
    from augsbert_ray.preflight import check_job
    from augsbert_ray.run_lock import RunLock
    from augsbert_ray.rundir import check_storage, is_uri, local_root

    check_run(job, fresh, verbose, address, until)
    cfg = load_job(job) if isinstance(job, (str, os.PathLike)) else job
    stages = recipe(cfg)  # once: the display's stages and the job's
    shown = stage_names(cfg, until, stages)  # an unknown stage: a ConfigError before anything else
    cfg, address = for_job(cfg, address)  # the job then connects there (runtime.start_ray reads ray.address)
    check(address)
    location = cfg.resolved_run_dir
    if is_uri(location):
        check_storage(str(location))
    with RunLock(local_root(location), shown=str(location)):
        # every check that needs no cluster, before the job's own files (its logs) exist; what is
        # allowed but likely a mistake is said before the display takes the terminal
        inputs = check_job(cfg, warn=lambda line: print(f"augsbert: warning: {line}", file=sys.stderr))
        return _run_watched(cfg, fresh=fresh, verbose=verbose, until=until, inputs=inputs, stages=stages,
                            shown=shown)


def job_stages(cfg, until: str | None = None) -> list[str]:
    """The stages a job runs (``until`` a stage: only it and those it depends on), in order,
    as the progress display counts them."""
    from augsbert_ray.pipeline import stage_names

    return stage_names(cfg, until)


def _display(stack: ExitStack, logs: Path, stages: list[str], verbose: bool, log_name: str = "job.log",
             retag: dict[str, tuple[str, str]] | None = None):
    """The progress display, which handles the engine's logging (``messages``) while ``stack``
    is open; unless ``verbose`` (or stderr is not the process's own), Ray's output goes to
    ``logs/ray.log`` and only the engine's lines (workers' too) and progress reach the terminal.
    Ray is stopped, and shipped model copies removed, when ``stack`` closes."""
    from augsbert_ray.artifacts import cleanup_shipped
    from augsbert_ray.progress import JobProgress
    from augsbert_ray.progress.messages import handled_by
    from augsbert_ray.progress.ray_logs import RayOutput
    from augsbert_ray.runtime import stop_ray

    capture = not verbose and sys.stderr is sys.__stderr__
    out = stack.enter_context(RayOutput(logs / "ray.log")) if capture else None
    stack.callback(stop_ray)  # inside the capture: Ray's shut-down messages go to the log too
    stack.callback(cleanup_shipped)  # (callbacks run last first: the copies go while Ray is up)
    progress = stack.enter_context(JobProgress(stages, stream=out.terminal if out else sys.stderr,
                                               log_path=logs / log_name,
                                               redirect_std=verbose))
    # The engine's lines, and those of Ray workers (RayOutput logs them), on the display; DEBUG in the log.
    stack.enter_context(handled_by(progress.logging_handler(retag=retag), logging.DEBUG))
    if out is not None:
        log.info(f"[augsbert] Ray's own messages: {logs / 'ray.log'} (--verbose shows them here)")
    return progress


def _run_watched(cfg, fresh: bool, verbose: bool, until: str | None, inputs, stages, shown: list[str]):
    from augsbert_ray.pipeline import run_job
    from augsbert_ray.rundir import local_root

    with ExitStack() as stack:
        progress = _display(stack, local_root(cfg.resolved_run_dir) / "logs", shown, verbose)
        return run_job(cfg, fresh=fresh, progress=progress, verbose=verbose, until=until, inputs=inputs,
                       stages=stages)


def label(model: str, pairs: str | Sequence[str], out: str | os.PathLike, *, columns: str | dict | None = None,
          format: str | None = None, score_column: str = "score", max_length: int = 128, precision: str = "auto",
          token_budget: int = 0, num_gpus: float = 0, actors: int | None = None, block_size: int = 0,
          address: str | None = None, fresh: bool = False, verbose: bool = False):
    """Scores pair files with a cross-encoder on the cluster, as ``augsbert label`` does.

    The pairs go through the silver stage's labelling pipeline (a Ray Data actor pool,
    shards committed exactly once); the output folder gets Parquet parts with every input
    column and the score (see ``labeling.output``). A re-run into the same folder resumes:
    committed shards are not scored again.

    Args:
        model: ``embedded``, a Hugging Face id or a local folder (as ``cross_encoder.model``).
        pairs: Parquet, JSON lines, CSV or TSV files, folders or globs, local or ``s3://``.
        out: the output folder (local).
        columns: the sentence columns, ``{"sentence1": NAME, "sentence2": NAME}`` or
            ``"sentence1=NAME,sentence2=NAME"`` (default: columns named sentence1, sentence2).
        format: ``parquet``, ``jsonl``, ``csv`` or ``tsv`` for every file (default: by extension).
        score_column: the name of the output's score column.
        max_length: token limit of a pair (as ``cross_encoder.max_length``).
        precision, token_budget, num_gpus, actors, block_size: as ``labeling.*`` in a job.
        address: a Ray cluster address (default: ``RAY_ADDRESS``, else a local Ray).
        fresh: start ``out`` over if it holds an earlier labelling.
        verbose: show Ray's own messages.

    Returns:
        A ``labeling.output.LabelSummary``.

    Before anything is read, the cluster address must answer (``cluster_address.check``); a
    GPU asked for must be on this machine where a local Ray is started; the model must load,
    its positions hold ``max_length`` tokens, and every input must be fit for the output
    table. The output folder is then claimed (``run_lock.RunLock``): a second labelling into
    it, or a ``fresh`` one, is refused while this one runs.

    Raises:
        AugSBERTError: a bad option, an address where no cluster answers, a missing file, a glob
            that matches nothing, a missing column, a bad row (named by file, line and field),
            a model that cannot be loaded, an output folder that holds something else or that
            another labelling is writing, all before Ray starts; an argument of the wrong type
            (``ArgumentTypeError``, also a ``TypeError``).
    """
    from augsbert_ray.api_arguments import check_label
    from augsbert_ray.cluster_address import check, choose
    from augsbert_ray.labeling import output as label_output
    from augsbert_ray.labeling import pair_files as label_files
    from augsbert_ray.models import check_cross_encoder, model_content_id
    from augsbert_ray.preflight.model_checks import check_label_length
    from augsbert_ray.preflight.resource_checks import check_local_gpu_request, joined_ray
    from augsbert_ray.run_lock import RunLock

    patterns = check_label(model, pairs, out, columns, format, score_column, max_length, precision, token_budget,
                           num_gpus, actors, block_size, address, fresh, verbose)
    model, out = str(model), str(out)
    where = choose(None, None, address)
    check(where)  # an address where no cluster answers: ray.init would retry for minutes
    cfg = _labeling_config(precision=precision, token_budget=token_budget, num_gpus=num_gpus, actors=actors,
                           block_size=block_size)
    if max_length <= 8:
        from augsbert_ray.errors import ConfigError

        raise ConfigError("--max-length", None, f"must be more than 8 tokens, got {max_length}")
    if not score_column.strip():
        from augsbert_ray.errors import ConfigError

        raise ConfigError("--score-column", None, "an empty name; name the output's score column")
    # a Ray this process joined already (a user's own ray.init) has the GPUs of its cluster
    check_local_gpu_request(num_gpus, "--num-gpus", where.address is None and not joined_ray(), "augsbert label")
    cols = label_files.parse_columns(columns)
    files = label_files.find_pair_files(patterns, format, exclude=out)
    trained = check_cross_encoder(model)
    check_label_length(model, max_length)
    record = {"model": model_content_id(model), "inputs": [[f.path, f.size, f.mtime_ns] for f in files],
              "columns": cols.model_dump(include={"sentence1", "sentence2"}), "score_column": score_column,
              "max_length": max_length, "precision": cfg.precision, "block_size": cfg.block_size}
    label_output.check_output(out, record, fresh)  # before the claim, which would write into a folder not ours
    with RunLock(out, shown=out, what="--out",
                 advice="one labelling at a time can write a folder: wait for it to end (or stop it), or name "
                        "another --out"):
        label_output.check_output(out, record, fresh)  # as it is now that no other labelling can change it
        inputs = label_files.check_inputs(files, cols, score_column)
        new = label_output.read_record(Path(out)) is None
        try:
            return _label_checked(model, inputs, Path(out), record, cfg, max_length, trained, where.address, fresh,
                                  verbose)
        except BaseException:
            if new:  # a first labelling that committed nothing leaves no folder that looks like one
                label_output.discard_if_empty(Path(out))
            raise
        finally:
            inputs.close()


def _labeling_config(**options):
    from pydantic import ValidationError

    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.errors import ConfigError

    try:
        return LabelingConfig(**{k: v for k, v in options.items() if v is not None})
    except ValidationError as e:
        err = e.errors()[0]
        key = "--" + str(err["loc"][0]).replace("_", "-") if err.get("loc") else None
        raise ConfigError(key, None, err["msg"]) from None


def _label_checked(model, inputs, out: Path, record: dict, cfg, max_length: int, trained: bool, address, fresh,
                   verbose):
    from augsbert_ray.labeling import LabelingReport, actor_cpus, label_shards, pool_size
    from augsbert_ray.labeling import output as label_output
    from augsbert_ray.labeling import pair_files as label_files
    from augsbert_ray.models import ship_if_local
    from augsbert_ray.runtime import start_ray

    root = label_output.open_output(out, record, fresh)
    with ExitStack() as stack:
        # the labelling is the silver stage's: its lines are shown as the label command's
        progress = _display(stack, root / label_output.LOGS, ["label"], verbose, log_name="label.log",
                            retag={"augsbert_ray.labeling": ("[silver]", "[label]")})
        log.info(f"[label] {inputs.pairs} pairs in {len(inputs.files)} file(s) -> {root}")
        if not trained:
            log.warning(f"[label] WARNING: {model} has no trained classification head: a new one is drawn (the "
                        "same in every actor and run), so its scores mean nothing. Score with a trained "
                        "cross-encoder, such as a job's models/cross-encoder.")
        cluster = start_ray(address, verbose=verbose, log_dir=None if verbose else root / label_output.LOGS)
        log.info(f"[label] Ray cluster: {cluster.describe()}")
        actors = pool_size(cfg, cluster.gpus, cluster.cpus)
        cpus = actor_cpus(cfg, cluster.cpus, actors)
        # The shards wait on the driver's disk, not in the object store (``labeling.spool``).
        store = label_output.LabelStore(root, inputs.score_column, staging=root / label_output.STAGING / "rows")
        stack.callback(shutil.rmtree, root / label_output.STAGING, True)

        def candidates():
            for shard in label_files.shards(inputs, cfg.block_size):
                store.hold(shard.index, shard.rows, shard.first_row)
                yield shard.candidates

        report = LabelingReport()
        progress.start_stage("label", total=inputs.pairs, unit="pairs")
        label_shards(candidates(), ship_if_local(model), cfg, max_length, cpus, store, report=report,
                     actors=actors, progress=progress.stage("label"), spool=root / label_output.STAGING / "shards")
        rate = report.labelled_pairs / report.seconds if report.seconds else 0.0
        progress.finish_stage("label", note=f"{rate:.1f} pairs/s, {report.reused} of {report.shards} shards "
                                            "from an earlier run")
        summary = label_output.LabelSummary(
            out=str(root), files=len(inputs.files), pairs=inputs.pairs, shards=report.shards,
            reused_shards=report.reused, labelled_pairs=report.labelled_pairs, seconds=report.seconds,
            pairs_per_s=rate, first_shard_seconds=report.first_shard_seconds, actors=actors)
        label_output.finish_output(root, summary)
        return summary


def bench(out: str | os.PathLike = "bench", *, quick: bool = False, model: str = "embedded",
          parts: Sequence[str] | None = None, address: str | None = None, data_dir: str | os.PathLike | None = None,
          verbose: bool = False, log=None, command: str | None = None):
    """Measures the cluster part by part, each beside its in-process peer, as ``augsbert bench`` does.

    Parts (``augsbert_ray.bench.PARTS``, always run in this order): ``labelling`` (the Ray
    pipeline for 1..N actors against ``CrossEncoder.predict``), ``bm25`` (against bm25s),
    ``semantic`` (Faiss exact and approximate against ``util.semantic_search``), ``training``
    (Ray Train against ``SentenceTransformer.fit``, and a stage's fixed cost) and
    ``control-plane`` (the labelling pipeline with a scorer that does no model work). A part
    that fails is recorded with its error and the others still run.

    Args:
        out: the folder for ``report.md``, ``report.json`` and the plot, each rewritten as a part ends.
        quick: small sizes: a few minutes on a small CPU.
        model: the encoder of every part: ``embedded``, a Hugging Face id or a local folder.
        parts: the parts to run (default: all).
        address: a Ray cluster address (default: ``RAY_ADDRESS``, else a local Ray).
        data_dir: where the STS benchmark is (``<data_dir>/stsb/sts-*.csv``; one given without
            it is an error). Default: ``AUGSBERT_DATA_DIR``; synthetic sentences without it.
        verbose: show Ray's own messages (else they go to ``out/logs/ray.log``).
        log: receives the progress lines (default: stderr).
        command: how the run was started, for the report (default: this call).

    Returns:
        The ``bench.records.BenchReport`` (also in ``out/report.json``); a failed part has
        ``status == "failed"`` and its ``error``.

    Raises:
        AugSBERTError: an unknown part, an address where no cluster answers, a ``data_dir``
            without the STS benchmark, an ``out`` that cannot be written or that holds files
            of something else, or a model that cannot be loaded, before Ray starts; an argument
            of the wrong type (``ArgumentTypeError``, also a ``TypeError``).
    """
    from augsbert_ray.bench.suite import run_bench

    return run_bench(out, quick=quick, model=model, parts=parts, address=address, data_dir=data_dir,
                     verbose=verbose, log=log, command=command)
