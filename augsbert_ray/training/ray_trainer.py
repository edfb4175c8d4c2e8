"""The Ray Train edge: runs ``train_pairs`` in a TorchTrainer and returns the saved model.

The training pairs travel through Ray's object store (not a shared disk), and the
trained model comes back as a Ray Train checkpoint under the run directory's storage.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from augsbert_ray import schema


@dataclass(frozen=True)
class WorkerResources:
    num_workers: int
    use_gpu: bool
    cpus_per_worker: float
    checkpoint_every: float = 0.25  # fraction of the steps between checkpoints; 0: only the end
    max_failures: int = 2


def _stdout_line(line: str) -> None:
    # Not print(): Ray Train patches print to tee into its logger, which shows every line twice.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# A training checkpoint (Ray Train's or a seed-search trial's): the full training state,
# and once training has ended also the model, loadable by sentence-transformers.
STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"


def write_checkpoint(trainer, recipe, directory: str | os.PathLike) -> None:
    trainer.save_state(Path(directory) / STATE_FILE)
    if trainer.step == trainer.total:
        recipe.save(trainer.module, str(Path(directory) / MODEL_DIR))


def restore_checkpoint(trainer, checkpoint) -> None:
    """Loads the training state of a Ray ``Checkpoint`` into ``trainer``."""
    with checkpoint.as_directory() as d:
        trainer.load_state(Path(d) / STATE_FILE)


def export_model(checkpoint, out_dir: str | os.PathLike) -> None:
    """Copies the model of a final checkpoint to ``out_dir`` (replacing what is there)."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with checkpoint.as_directory() as d:
        shutil.copytree(Path(d) / MODEL_DIR, out_dir)


def _train_loop_per_worker(config: dict) -> None:
    import ray
    import ray.train
    import ray.train.torch
    import torch

    from augsbert_ray.training.loop import HParams, PairTrainer
    from augsbert_ray.training.recipes import make_recipe

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(config["threads"])))
    table: pa.Table = ray.get(config["data"])
    recipe = make_recipe(config["kind"], **config["recipe"])
    device = ray.train.torch.get_device()
    if world > 1:
        wrap = ray.train.torch.prepare_model  # moves to the device and wraps in DDP
    else:
        wrap = lambda m: m.to(device)  # noqa: E731

    # Rank 0 reports: progress lines and steps to the job's display when it has one.
    progress = config.get("progress") if rank == 0 else None
    say = (progress.message if progress is not None else _stdout_line) if rank == 0 else (lambda line: None)
    trainer = PairTrainer(
        recipe,
        *schema.pair_lists(table),
        HParams(**config["hparams"]),
        device=str(device),
        rank=rank,
        world=world,
        wrap=wrap,
        log=say,
        name=config["name"],
    )
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # a restarted worker group: continue where the last checkpoint left off
        restore_checkpoint(trainer, checkpoint)
        say(f"[{config['name']}] the worker group restarted: resumed from the checkpoint at step "
            f"{trainer.step}/{trainer.total}")
    resumed_from = trainer.step
    every = max(1, round(config["checkpoint_every"] * trainer.total)) if config["checkpoint_every"] else trainer.total
    after_step = _chain(_fault_hook(config.get("fault"), rank), _step_reporter(progress, trainer))
    while trainer.step < trainer.total:
        trainer.run(until=min(trainer.total, (trainer.step // every + 1) * every), after_step=after_step)
        if progress is not None:
            progress.flush()
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                write_checkpoint(trainer, recipe, tmp)
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({**trainer.stats(), "resumed_from_step": resumed_from}, checkpoint=ckpt)


def _step_reporter(progress, trainer):
    """An ``after_step`` hook that reports the step to the job's display (batched by the handle)."""
    if progress is None:
        return None
    progress.set_total(trainer.total, unit="steps")
    progress.update(trainer.step)
    return lambda step: progress.update(step)


def _chain(*hooks):
    hooks = [h for h in hooks if h is not None]
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]
    return lambda step: [h(step) for h in hooks]


def _fault_hook(fault: dict | None, rank: int):
    """Fault injection for chaos tests: the worker of ``rank`` exits hard after ``step``, once.

    ``fault = {"rank": r, "step": s, "flag": path}``; the flag file records that the fault
    fired, so the restarted worker trains on.
    """
    if not fault or fault["rank"] != rank:
        return None

    def hook(step: int) -> None:
        flag = Path(fault["flag"])
        if step == fault["step"] and not flag.exists():
            flag.write_text(str(step))
            os._exit(1)  # a crash, not an exception: no cleanup, no report

    return hook


def _storage(location) -> str:
    """Ray Train's storage: a URI (s3://...) as is, a local path made absolute."""
    from augsbert_ray.rundir import is_uri

    return str(location) if is_uri(location) else str(Path(location).absolute())


def train_on_ray(
    kind: str,
    pairs: pa.Table,
    recipe: dict,
    hparams: dict,
    resources: WorkerResources,
    storage_dir: Path,
    out_dir: Path,
    name: str,
    fault: dict | None = None,
    run_name: str | None = None,
    progress=None,
) -> dict:
    """Fine-tunes one encoder with Ray Train and copies the trained model to ``out_dir``.

    Args:
        kind: ``bi_encoder`` or ``cross_encoder`` (see ``recipes.RECIPES``).
        pairs: training pairs with ``sentence1``, ``sentence2`` and ``label`` columns.
        recipe: keyword arguments of the recipe (model, max_length, ...).
        hparams: ``loop.HParams`` fields.
        resources: workers, GPUs and CPUs per worker.
        storage_dir: Ray Train's storage (checkpoints, logs): a local path or a URI.
        out_dir: where the final model is written, loadable by sentence-transformers.
        name: the model's name, shown in progress.
        fault: fault injection for chaos tests (see ``_fault_hook``).
        run_name: the Ray Train run's name, its folder under ``storage_dir`` (default: ``name``).
            Ray Train resumes a run from the latest checkpoint stored under its name, so a
            different training must have a different run name.
        progress: a ``StageProgress`` bound to the job's display through a picklable
            ``progress_channel.ProgressHandle`` (None: rank 0 prints its progress lines).
            Rank 0 reports the total steps and each step, and its progress lines as messages.

    Returns:
        The training statistics reported by rank 0.
    """
    import ray
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from augsbert_ray.runtime import train_log_level

    columns = [schema.SENTENCE1, schema.SENTENCE2, schema.LABEL]

    trainer = TorchTrainer(
        _train_loop_per_worker,
        train_loop_config={
            "kind": kind,
            "name": name,
            "recipe": recipe,
            "hparams": hparams,
            "threads": resources.cpus_per_worker,
            "data": ray.put(pairs.select(columns)),
            "checkpoint_every": resources.checkpoint_every,
            "fault": fault,
            "progress": progress,
        },
        scaling_config=ScalingConfig(
            num_workers=resources.num_workers,
            use_gpu=resources.use_gpu,
            resources_per_worker={"CPU": resources.cpus_per_worker},
        ),
        run_config=RunConfig(
            name=run_name or name,
            storage_path=_storage(storage_dir),
            failure_config=FailureConfig(max_failures=resources.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),  # the latest two training states
            # WARNING unless verbose: no "Checkpoint successfully created" per checkpoint nor
            # worker-group start-up lines on the console (Ray Train's session files keep them).
            logging_config=LoggingConfig(log_level=train_log_level()),
        ),
    )
    result = trainer.fit()
    export_model(result.checkpoint, out_dir)
    return dict(result.metrics)
