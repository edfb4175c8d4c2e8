"""The Ray Train edge: runs ``train_pairs`` on Ray and returns the saved model.

Where it runs, a Ray Train worker group or one of the job's warm hosts, is the caller's
declared choice (``training.executors``); everything else here is the same for both.

A small training set travels through Ray's object store; a large one, or one given as files
or a Ray Data dataset, is staged beside the run in its storage and each worker reads only its
own batches' rows (``training.ingest``). The trained model comes back as a Ray Train
checkpoint under the run directory's storage.

Failures come in two kinds. A transient fault (a worker process killed, a node lost) is
what Ray Train's restarts are for: the worker group restarts from the latest checkpoint,
up to ``training.max_failures`` times. An error that would recur on every attempt (bad
data or config, model files that cannot be loaded, a shape mismatch: ``is_permanent``) is
not retried: the worker catches it and reports it, and ``train_on_ray`` raises one
``TrainingError`` naming it, with the traceback saved beside Ray Train's run. Exhausted
restarts end in a ``TrainingError`` too, naming the limit.

A worker reports a permanent error by writing it (message and traceback) to a marker file
beside the run, in Ray Train's storage, which the driver reads when ``fit`` returns. With
one worker it then returns normally, so the run ends at once, without a restart. With
several, ranks wait for each other in DDP's collectives, so a rank that failed alone cannot
just return (the others would hang until the collective times out): it raises, Ray Train
stops the group and restarts it once, and every rank of the new group finds the marker and
returns at once. (Ray Train V2 keeps only the metrics reported with a checkpoint, so the
error does not travel as a reported metric.)
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.errors import AugSBERTError, TrainingError, is_disk_full, writing
from augsbert_ray.progress.messages import handled_by, lines_to
from augsbert_ray.training.executors import Executor, WorkerGroup
from augsbert_ray.training.ingest import TrainingSet, feed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerResources:
    num_workers: int
    use_gpu: bool
    cpus_per_worker: float
    checkpoint_every: float = 0.25  # fraction of the steps between checkpoints; 0: only the end
    max_failures: int = 2
    checkpoint_min_seconds: float = 0.0  # skip an intermediate checkpoint sooner than this after the last


def _stdout_line(line: str) -> None:
    # Not print(): Ray Train patches print to tee into its logger, which shows every line twice.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# A training checkpoint (Ray Train's or a seed-search trial's): the full training state,
# and once training has ended also the model, loadable by sentence-transformers.
STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"


def write_checkpoint(trainer, recipe, directory: str | os.PathLike) -> None:
    with writing(directory):
        trainer.save_state(Path(directory) / STATE_FILE)
        if trainer.step == trainer.total:
            recipe.save(trainer.module, str(Path(directory) / MODEL_DIR))


def restore_checkpoint(trainer, checkpoint) -> None:
    """Loads the training state of a Ray ``Checkpoint`` into ``trainer``."""
    with checkpoint.as_directory() as d:
        trainer.load_state(Path(d) / STATE_FILE)


def export_model(checkpoint, out_dir: str | os.PathLike) -> None:
    """Copies the model of a final checkpoint to ``out_dir`` (replacing what is there).

    The copy is made beside ``out_dir`` and renamed into place, so a kill or a full disk
    mid-copy leaves no half-written model where a finished one belongs.

    Raises:
        TrainingError: ``checkpoint`` holds no model (it is not a final one).
        DiskFullError: the disk filled up during the copy (nothing is left of it).
    """
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.exporting")
    with checkpoint.as_directory() as d:
        model = Path(d) / MODEL_DIR
        if not (model / "config.json").is_file():
            raise TrainingError(f"the checkpoint {d} holds no trained model to export ({MODEL_DIR}/ is missing "
                                f"or incomplete)")
        shutil.rmtree(tmp, ignore_errors=True)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            with writing(out_dir):
                shutil.copytree(model, tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


# Messages, not types, for these two: torch raises a shape mismatch as a plain RuntimeError and
# transformers a missing or unloadable model file as a plain OSError; neither has a subclass to test.
# RuntimeErrors that would recur on every attempt: weights that do not fit the model.
_PERMANENT_RUNTIME = re.compile(r"Error\(s\) in loading state_dict|size mismatch|shape mismatch|"
                                r"mat1 and mat2 shapes cannot be multiplied|must match the size of tensor")
# OSErrors of missing or unloadable model files (transformers raises plain OSError for them);
# other OSErrors (connection resets, a full disk) may pass and keep their retries.
_PERMANENT_OS = re.compile(r"does not appear to have a file named|no file named|Can't load|"
                           r"is not a local folder and is not a valid model identifier|not a valid JSON file")


def is_permanent(error: BaseException) -> bool:
    """Whether a training error would recur on every retry, so retrying only wastes time.

    Permanent: the package's own errors (``AugSBERTError``: data, config, model folders);
    ``ValueError``, ``TypeError``, ``KeyError``, ``IndexError``, ``AttributeError``,
    ``NotImplementedError`` and ``ImportError`` (code, config or data that does not fit);
    ``RuntimeError`` about weights or shapes that do not match; safetensors' ``SafetensorError``
    (a damaged weights file); ``FileNotFoundError``,
    ``IsADirectoryError``, ``NotADirectoryError``, ``PermissionError`` and ``OSError`` about
    model files that are missing or cannot be loaded. Anything else (a worker killed, a
    lost node, out of memory, network errors) is transient and keeps Ray Train's restarts.
    """
    if isinstance(error, AugSBERTError):
        return True
    if is_disk_full(error):  # a retry seconds later meets the same full disk
        return True
    if type(error).__name__ == "SafetensorError":  # a weights file that does not deserialize
        return True
    if isinstance(error, (ValueError, TypeError, KeyError, IndexError, AttributeError, NotImplementedError,
                          ImportError)):
        return True
    if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        return True
    if isinstance(error, OSError):
        return bool(_PERMANENT_OS.search(str(error)))
    if isinstance(error, RuntimeError):
        return bool(_PERMANENT_RUNTIME.search(str(error)))
    return False


def describe_error(error: BaseException) -> str:
    """``Type: message`` on one line (the message's first line; a long one is cut)."""
    first = (str(error).strip().splitlines() or [""])[0]
    if len(first) > 500:
        first = first[:500] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _train_loop_per_worker(config: dict) -> None:
    """The worker's body: trains, or records a permanent error for the driver (see the module)."""
    import ray.train

    ctx = ray.train.get_context()
    world = ctx.get_world_size()
    marker = config.get("fatal_marker")
    if marker and world > 1 and _read_marker(marker) is not None:
        return  # a rank of the previous attempt met a permanent error; the driver reports it
    try:
        with _worker_lines(config, ctx.get_world_rank()):
            _train(config)
    except Exception as e:
        if not marker or not is_permanent(e):
            raise
        try:
            _write_marker(marker, {"error": describe_error(e), "traceback": traceback.format_exc()},
                          ctx.get_world_rank())
        except OSError:  # a full disk: the error itself goes to the driver instead of its record
            raise e from None
        if world > 1:
            raise  # the other ranks may be waiting for this one in a collective: Ray Train stops them


def _worker_lines(config: dict, rank: int):
    """Rank 0's engine lines (the training loop's) go to the job's display when it has one,
    else to stdout, which Ray forwards to the driver; other ranks' are not shown."""
    if rank != 0:
        return nullcontext()
    progress = config.get("progress")
    if progress is None:
        return lines_to(_stdout_line)
    from augsbert_ray.tracking.points import PointHandler

    # the loop's loss and learning rate at each logged step travel beside its lines, for tracking
    both = ExitStack()
    both.enter_context(lines_to(progress.message))
    both.enter_context(handled_by(PointHandler(progress)))
    return both


def _train(config: dict) -> None:
    import ray
    import ray.train
    import ray.train.torch
    import torch

    from augsbert_ray.training.loop import HParams, PairTrainer
    from augsbert_ray.training.recipes import make_recipe

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(config["threads"])))
    recipe = make_recipe(config["kind"], **config["recipe"])
    from augsbert_ray.devices import usable

    # On a warm host (local mode) the device is the host's; Ray Train's worker knows its own.
    device = usable(config.get("device") or ray.train.torch.get_device())
    if world > 1:
        # Moves to the device and wraps in DDP. Some weights get no gradient (a bi-encoder's
        # pooler under mean pooling), which DDP refuses at the second step unless told to look.
        def wrap(m):
            return ray.train.torch.prepare_model(m, move_to_device=torch.device(device),
                                                 parallel_strategy_kwargs={"find_unused_parameters": True})
    else:
        wrap = lambda m: m.to(device)  # noqa: E731

    # Rank 0 reports its steps to the job's display when it has one (its lines: _worker_lines).
    progress = config.get("progress") if rank == 0 else None
    data = config["data"]
    if "staged" in data:  # read batch by batch (training.ingest)
        from augsbert_ray.training.ingest import PairReader

        reader = PairReader(data["staged"])
        pairs, given = (None, None, None), {"rows": reader, "lengths_key": {"kind": config["kind"], **config["recipe"]}}
    else:
        table: pa.Table = ray.get(data["table"])
        pairs, given = schema.pair_lists(table), {"silver": schema.silver_flags(table)}

    def new_trainer() -> PairTrainer:
        return PairTrainer(recipe, *pairs, HParams(**config["hparams"]), device=str(device), rank=rank,
                           world=world, wrap=wrap, name=config["name"], **given)

    trainer = new_trainer()
    checkpoint = ray.train.get_checkpoint()
    persisted = config.get("checkpoint_dir")  # a warm host's run: checkpoints are written here (warm_fit)
    if checkpoint is not None:  # a restarted worker group: continue where the last checkpoint left off
        restore_checkpoint(trainer, checkpoint)
    elif persisted:
        trainer, checkpoint = _restore_persisted(trainer, new_trainer, persisted, config["name"])
    if checkpoint is not None:
        # A restarted worker group, or a re-run of a stage whose driver died mid-training.
        log.info(f"[{config['name']}] resumed from the checkpoint at step {trainer.step}/{trainer.total}")
    resumed_from = trainer.step
    every = max(1, round(config["checkpoint_every"] * trainer.total)) if config["checkpoint_every"] else trainer.total
    min_gap = float(config.get("checkpoint_min_seconds") or 0)
    last_saved = time.monotonic()
    after_step = _step_reporter(progress, trainer)
    reported = False
    while trainer.step < trainer.total:
        trainer.run(until=min(trainer.total, (trainer.step // every + 1) * every), after_step=after_step)
        if progress is not None:
            progress.flush()
        if trainer.step < trainer.total and not _agreed(time.monotonic() - last_saved >= min_gap, world, device):
            continue  # too soon after the last checkpoint: writing it would cost more than it could save
        last_saved = time.monotonic()
        _report(trainer, recipe, {**trainer.stats(), "resumed_from_step": resumed_from}, persisted, rank)
        reported = True
    if not reported:
        # Resumed from the final checkpoint (the driver was stopped after the last step, or the
        # export failed): the model is written again from its state, so the run has one to export.
        _report(trainer, recipe, {**trainer.stats(), "resumed_from_step": resumed_from}, persisted, rank)


def _report(trainer, recipe, metrics: dict, persisted: str | None, rank: int) -> None:
    """Writes a checkpoint of ``trainer`` and reports it with ``metrics`` to Ray Train: into
    ``persisted`` on a warm host (``warm_fit``), else rank 0's from a temporary folder."""
    import ray.train

    from augsbert_ray.training.warm_fit import persist_checkpoint

    if persisted:
        saved = persist_checkpoint(lambda d: write_checkpoint(trainer, recipe, d), persisted, trainer.step)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(saved)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = None
        if rank == 0:
            write_checkpoint(trainer, recipe, tmp)
            ckpt = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=ckpt)


def _restore_persisted(trainer, new_trainer, run_dir: str, name: str):
    """Restores the newest checkpoint under ``run_dir`` that loads, into ``trainer``.

    A checkpoint that does not load (a file cut short by a full disk, or by a kill while
    another writer copied it in) is removed with a warning and the next older one is tried;
    the training starts over when none is left. Returns (the trainer, the checkpoint or None):
    a new trainer when a failed load may have changed the one given.
    """
    import ray.train

    from augsbert_ray.training.warm_fit import checkpoints_newest_first

    for found in checkpoints_newest_first(run_dir, STATE_FILE):
        checkpoint = ray.train.Checkpoint.from_directory(str(found))
        try:
            restore_checkpoint(trainer, checkpoint)
            return trainer, checkpoint
        except Exception as e:  # noqa: BLE001 - any failure to load means the checkpoint is unusable
            log.warning(f"[{name}] the checkpoint {found} does not load ({describe_error(e)}); "
                        f"removed, an older one is used")
            shutil.rmtree(found, ignore_errors=True)
            trainer = new_trainer()
    return trainer, None


def _agreed(flag: bool, world: int, device) -> bool:
    """Rank 0's ``flag`` on every rank: a checkpoint is a collective report, so all ranks must
    take the same decision, and clocks that differ by a step would not."""
    if world == 1:
        return flag
    import torch
    import torch.distributed as dist

    decision = torch.tensor([int(flag)], device=device)
    dist.broadcast(decision, src=0)
    return bool(decision.item())


def _step_reporter(progress, trainer):
    """An ``after_step`` hook that reports the step to the job's display (batched by the handle)."""
    if progress is None:
        return None
    progress.set_total(trainer.total, unit="steps")
    progress.update(trainer.step)
    return lambda step: progress.update(step)


def _storage(location) -> str:
    """Ray Train's storage: a URI (s3://...) as is, a local path made absolute."""
    from augsbert_ray.rundir import is_uri

    return str(location) if is_uri(location) else str(Path(location).absolute())


# A marker file beside a Ray Train run (in its storage, local or a URI), written by a rank that
# met a permanent error when several workers train (see the module docstring).
def _filesystem(location: str):
    import pyarrow.fs as pafs

    from augsbert_ray.rundir import is_uri

    return pafs.FileSystem.from_uri(location) if is_uri(location) else (pafs.LocalFileSystem(), location)


def _write_marker(location: str, record: dict, rank: int) -> None:
    """Writes the marker whole (under a name of this rank's, then moved: several ranks may fail at once)."""
    fs, path = _filesystem(location)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(f"{path}.{rank}.tmp") as f:
        f.write(json.dumps(record).encode())
    fs.move(f"{path}.{rank}.tmp", path)


def _read_marker(location: str) -> dict | None:
    import pyarrow.fs as pafs

    fs, path = _filesystem(location)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        try:
            record = json.loads(f.read().decode())
        except (UnicodeDecodeError, ValueError):
            return None
    return record if isinstance(record, dict) and "error" in record else None


def _remove_marker(location: str) -> None:
    import pyarrow.fs as pafs

    fs, path = _filesystem(location)
    if fs.get_file_info(path).type == pafs.FileType.File:
        fs.delete_file(path)


def _save_traceback(storage: str, run: str, trace: str) -> str | None:
    """Writes a worker's traceback beside the run (a local storage only); returns its path."""
    from augsbert_ray.rundir import is_uri

    if is_uri(storage) or not trace:
        return None
    path = Path(storage) / f"{run}.error.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(trace, encoding="utf-8")
    except OSError:  # a full disk, often the error being reported: the message goes without it
        return None
    return str(path)


def _failure_summary(error: BaseException) -> str:
    """The first worker failure of a Ray Train error, on one line."""
    failures = getattr(error, "worker_failures", None) or {}
    first = next(iter(failures.values()), None)
    cause = getattr(first, "cause", None) or first
    return describe_error(cause if cause is not None else error)


def train_on_ray(
    kind: str,
    pairs: pa.Table | TrainingSet,
    recipe: dict,
    hparams: dict,
    resources: WorkerResources,
    storage_dir: Path,
    out_dir: Path,
    name: str,
    progress=None,
    executor: Executor | None = None,
) -> dict:
    """Fine-tunes one encoder on Ray and copies the trained model to ``out_dir``.

    Args:
        kind: ``bi_encoder`` or ``cross_encoder`` (see ``recipes.RECIPES``).
        pairs: training pairs with ``sentence1``, ``sentence2`` and ``label`` columns (and
            ``schema.IS_SILVER`` for a student): a table, or files or a Ray Data dataset
            (``ingest.TrainingSet``). The executor says from what size the pairs are streamed
            (``stream_above_rows``, ``training.ingest``); smaller ones go whole.
        recipe: keyword arguments of the recipe (model, max_length, ...).
        hparams: ``loop.HParams`` fields.
        resources: workers, GPUs and CPUs per worker.
        storage_dir: Ray Train's storage (checkpoints, logs): a local path or a URI. Ray Train
            resumes a run from the latest checkpoint stored under ``storage_dir/name``, so each
            distinct training needs its own (the job gives every stage fingerprint its own folder).
        out_dir: where the final model is written, loadable by sentence-transformers.
        name: the model's name, shown in progress.
        progress: a ``StageProgress`` bound to the job's display through a picklable
            ``progress_channel.ProgressHandle`` (None: rank 0 prints its progress lines).
            Rank 0 reports the total steps and each step, and its progress lines as messages.
        executor: where the training runs (``executors``: a warm host or a Ray Train worker
            group, as the job's context chose); None: a worker group.

    Returns:
        The training statistics reported by rank 0.

    Raises:
        TrainingError: a permanent error in the training loop (``permanent=True``, not
            retried), or the restarts exhausted by transient faults.
    """
    from augsbert_ray.runtime import require_resources

    require_resources([{"CPU": resources.cpus_per_worker, "GPU": 1 if resources.use_gpu else 0}]
                      * resources.num_workers,
                      f"training {name} (training.num_workers, training.cpus_per_worker, training.use_gpu)")
    storage = _storage(storage_dir)
    executor = executor or WorkerGroup()
    loop_config = _prepare_run(kind, pairs, recipe, hparams, resources, storage, name, progress, executor)
    trained = _run_on(executor, loop_config, resources, storage, name)
    return _finish_run(trained, loop_config["fatal_marker"], name, storage, out_dir)


def _prepare_run(kind: str, pairs: pa.Table | TrainingSet, recipe: dict, hparams: dict, resources: WorkerResources,
                 storage: str, name: str, progress, executor: Executor) -> dict:
    """Clears an earlier attempt's error marker and builds the workers' config, the pairs fed to suit the executor."""
    marker = f"{storage.rstrip('/')}/{name}.fatal.json"
    _remove_marker(marker)  # an earlier attempt's error is not this one's
    return {
        "kind": kind,
        "name": name,
        "recipe": recipe,
        "hparams": hparams,
        "threads": resources.cpus_per_worker,
        "data": feed(pairs, f"{storage.rstrip('/')}/{name}-pairs", executor.stream_above_rows),
        "checkpoint_every": resources.checkpoint_every,
        "checkpoint_min_seconds": resources.checkpoint_min_seconds,
        "fatal_marker": marker,
        "progress": progress,
    }


def _run_on(executor: Executor, loop_config: dict, resources: WorkerResources, storage: str, name: str):
    """Runs the training on the executor, turning a failed run into a permanent or restarts-exhausted TrainingError."""
    from ray.train import TrainingFailedError

    from augsbert_ray.training.warm_fit import RestartsExhausted

    run, marker = name, loop_config["fatal_marker"]
    try:
        return executor.fit(_train_loop_per_worker, loop_config, resources, storage, run,
                            what=f"training {name} (training.cpus_per_worker, training.use_gpu)")
    except TrainingFailedError as e:
        fatal = _read_marker(marker)
        if fatal is not None:  # several workers, no restart left to report it from
            _remove_marker(marker)
            raise _fatal(name, storage, run, fatal["error"], fatal["traceback"]) from None
        raise _restarts_exhausted(name, resources, storage, run, _failure_summary(e)) from None
    except RestartsExhausted as e:
        raise _restarts_exhausted(name, resources, storage, run, describe_error(e.cause)) from None


def _finish_run(trained, marker: str, name: str, storage: str, out_dir: Path) -> dict:
    """Raises a recorded permanent error or a missing final checkpoint, else exports the model; returns the stats."""
    _raise_recorded_error(marker, name, storage, name)
    if trained.checkpoint is None:  # not expected: every attempt that ends reports a final checkpoint
        raise TrainingError(f"training {name} ended without a final checkpoint in {storage.rstrip('/')}/{name}; "
                            f"a re-run resumes from the latest one there")
    export_model(trained.checkpoint, out_dir)
    return {**trained.metrics, "storage_filesystem": trained.filesystem}


def _restarts_exhausted(name: str, resources: WorkerResources, storage: str, run: str, cause: str) -> TrainingError:
    return TrainingError(
        f"training {name} failed with no restart left (training.max_failures={resources.max_failures}); its "
        f"checkpoints are kept in {storage.rstrip('/')}/{run} and a re-run resumes from the latest: {cause}")


def _raise_recorded_error(marker: str, name: str, storage: str, run: str) -> None:
    """Raises the permanent error a worker recorded in ``marker``, if any (see the module)."""
    fatal = _read_marker(marker)
    if fatal is not None:
        _remove_marker(marker)
        raise _fatal(name, storage, run, fatal["error"], fatal.get("traceback", ""))


def _fatal(name: str, storage: str, run: str, error: str, trace: str) -> TrainingError:
    saved = _save_traceback(storage, run, trace)
    where = f"; the traceback is in {saved}" if saved else ""
    return TrainingError(f"training {name} failed with an error that no retry can fix, so none was made: "
                         f"{error}{where}", permanent=True)
