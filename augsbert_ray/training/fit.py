"""Trains one encoder for a stage: one Ray Train run, or a seed search on Ray Tune.

The stage's folder holds everything: Ray's checkpoints under the stage's storage (so an
interrupted stage resumes its own run, and no other configuration can ever restore it)
and the exported model in ``<out>/model``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from augsbert_ray.runtime import per_worker_cpus
from augsbert_ray.training.ingest import TrainingSet


def hparams(encoder, job_seed: int, training, precision: str | None = None) -> dict:
    """The optimisation hyperparameters of an encoder's config section and the job's
    ``training`` settings (``loop.HParams`` fields); ``precision`` overrides the training's."""
    seed = getattr(encoder, "seed", None)
    return {"epochs": encoder.epochs, "lr": encoder.lr, "batch_size": encoder.batch_size,
            "warmup_ratio": encoder.warmup_ratio, "seed": job_seed if seed is None else seed,
            "precision": precision or training.precision, "length_grouping": training.length_grouping}


def fit_encoder(kind: str, train: pa.Table | TrainingSet, dev: pa.Table | None, *, recipe: dict, hparams: dict, training,
                seed_search, searched: bool, task: str, metric: str, eval_batch_size: int, out: Path,
                storage: str, cluster, name: str, progress=None, executor=None) -> dict:
    """Fine-tunes one encoder and writes the model to ``out / "model"``.

    Args:
        kind: ``bi_encoder`` or ``cross_encoder``.
        train: training pairs (``sentence1``, ``sentence2``, ``label``): a table, or Parquet
            files or a Ray Data dataset (``ingest.TrainingSet``), streamed to the workers
            (``training.ingest``); a seed search reads a ``TrainingSet`` whole.
        dev: the pairs a seed search scores its seeds on (None without a search).
        recipe, hparams: what to train and how (``training.recipes``, ``training.loop.HParams``).
        training: the job's ``training`` settings (workers, GPUs, checkpoints, failures).
        seed_search: the job's ``seed_search`` settings; used when ``searched``.
        task, metric, eval_batch_size: how a seed search scores dev.
        out: the stage's folder; storage: where Ray keeps the stage's checkpoints.
        cluster: the cluster's resources (``runtime.ClusterResources``).
        name: shown in progress lines.
        progress: the stage's reporter for the job's display (training steps), or None.
        executor: where a training without a search runs (``executors``; the job's context
            chooses it); None: a Ray Train worker group.

    Returns:
        The training statistics (``{"seed_search": record}`` for a search).
    """
    from augsbert_ray.training.ray_trainer import WorkerResources, train_on_ray

    model_dir = out / "model"
    if not searched:
        resources = WorkerResources(training.num_workers, training.use_gpu,
                                    per_worker_cpus(training.cpus_per_worker, cluster.cpus, training.num_workers),
                                    training.checkpoint_every, training.max_failures,
                                    training.checkpoint_min_seconds)
        return train_on_ray(kind, train, recipe=recipe, hparams=hparams, resources=resources,
                            storage_dir=f"{storage}/train", out_dir=model_dir, name=name, progress=progress,
                            executor=executor)
    from augsbert_ray.training.seed_search import SearchPlan, seed_search as run_search

    if isinstance(train, TrainingSet):  # Ray Tune's trials take their pairs whole
        train = train.to_table()
    ss = seed_search
    seeds = ss.seed_list(hparams["seed"])
    gpus = ss.gpus_per_trial if ss.gpus_per_trial is not None else (1 if training.use_gpu else 0)
    plan = SearchPlan(seeds=seeds, keep=ss.keep, prune_at=ss.prune_at, scheduler=ss.scheduler, audit=ss.audit,
                      cpus_per_trial=per_worker_cpus(ss.cpus_per_trial, cluster.cpus, len(seeds)),
                      gpus_per_trial=gpus)
    record = run_search(kind, train, dev, task=task, metric=metric, recipe=recipe, hparams=hparams, plan=plan,
                        storage_dir=f"{storage}/tune", out_dir=model_dir, name=name,
                        eval_batch_size=eval_batch_size)
    return {"seed_search": record}


def throughput(stats: dict, seconds: float) -> str:
    """A training stage's rate: pairs/s inside the training loop, or steps/s over a seed search."""
    if stats.get("pairs_per_s"):
        precision = f", {stats['precision']}" if stats.get("precision") else ""
        return f"{stats['pairs_per_s']:.1f} training pairs/s (in the training loop{precision})"
    if "seed_search" in stats and seconds:
        return f"{stats['seed_search']['cost']['steps_run'] / seconds:.2f} training steps/s over all seeds"
    return ""


def planned_steps(encoder, n_pairs: int, training) -> int:
    """The training steps of an encoder on ``n_pairs`` pairs (for the progress display)."""
    from augsbert_ray.training.schedule import rank_batch_size, steps_per_epoch

    world = training.num_workers
    return steps_per_epoch(n_pairs, rank_batch_size(encoder.batch_size, world), world) * encoder.epochs


def host_start_seconds(stats: dict) -> float | None:
    """The part of a training stage's fixed cost spent starting the job's warm host (its process
    and imports), paid once per host by the first stage it serves; None if this stage did not."""
    value = stats.get("host_start_seconds")
    return None if value is None else float(value)


def fixed_seconds(stats: dict, seconds: float) -> float | None:
    """A training stage's time outside its training loop: Ray Train's start, loading the model
    and the data, checkpoints, exporting the model (None for a seed search)."""
    loop = stats.get("seconds")
    return None if loop is None or "seed_search" in stats else max(0.0, seconds - loop)
