"""Seed optimisation on Ray Tune: train N seeds to a pruning point, continue only the best K.

Fine-tuning on small data depends heavily on the random seed (Dodge et al. 2020). The
AugSBERT paper trains several seeds, scores each on dev after 20% of the training steps,
and continues only the best one. This module gives exactly those semantics:

1. *explore*: N Ray Tune trials (one per seed, in parallel as resources allow) train to
   the pruning step, score dev, save their full training state as a checkpoint and end,
   releasing their resources;
2. *exploit*: exactly the K best trials by that dev score are resumed from their
   checkpoints (the step counter continues; nothing restarts) and trained to the end;
   the survivor with the best final dev score is the model.

Ray's ASHA scheduler is asynchronous and cannot promise that exactly K survive (a trial
reaching the pruning point early is judged against whoever has reported so far), so it
is offered only as ``scheduler: asha``. Audit mode trains every seed to the end and
reports how well the ranking at the pruning point predicted the final ranking (the
paper's Appendix D); the chosen model is still the search's, so auditing changes no
result.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.errors import TrainingError
from augsbert_ray.rundir import is_uri
from augsbert_ray.training import seed_choice
from augsbert_ray.training.ray_trainer import (
    describe_error,
    export_model,
    is_permanent,
    restore_checkpoint,
    write_checkpoint,
)

log = logging.getLogger(__name__)

FATAL_ERROR = "fatal_error"  # the metric a trial reports an error under that no retry can fix


@dataclass(frozen=True)
class SearchPlan:
    """What to search: the seeds, how many continue, and where the pruning point is."""

    seeds: list[int]
    keep: int
    prune_at: float
    scheduler: str = "exact"  # exact | asha
    audit: bool = False
    cpus_per_trial: float = 1
    gpus_per_trial: float = 0

    def prune_step(self, total_steps: int) -> int:
        """The step at which every seed is scored: ``prune_at`` of the total, at least 1."""
        return min(total_steps, max(1, math.ceil(self.prune_at * total_steps)))


def _trial(config: dict, data: pa.Table, dev: pa.Table) -> None:
    """One seed's training as a Tune function trainable.

    Trains from the start (or from ``config["resume"]``, a checkpoint) up to
    ``config["stop_step"]``, scoring dev at each step of ``config["eval_steps"]`` on the way
    and reporting it with a checkpoint of the training state; at the last step of training
    the checkpoint also holds the exported model.

    An error that would recur on every attempt (``ray_trainer.is_permanent``) is reported as
    ``fatal_error`` and ends the trial; ``seed_search`` then raises it as a ``TrainingError``.
    """
    import ray.tune

    try:
        _train_trial(config, data, dev)
    except Exception as e:
        if not is_permanent(e):
            raise
        ray.tune.report({"seed": config["seed"], FATAL_ERROR: describe_error(e)})


def _train_trial(config: dict, data: pa.Table, dev: pa.Table) -> None:
    import ray.tune
    import torch

    from augsbert_ray.evaluation import task_metrics
    from augsbert_ray.training.loop import HParams, PairTrainer
    from augsbert_ray.training.recipes import make_recipe

    torch.set_num_threads(max(1, int(config["threads"])))
    device = "cuda" if config["gpus"] and torch.cuda.is_available() else "cpu"
    s1, s2, labels = schema.pair_lists(data)
    recipe = make_recipe(config["kind"], **config["recipe"])
    hp = HParams(**{**config["hparams"], "seed": config["seed"]})
    trainer = PairTrainer(recipe, s1, s2, labels, hp, silver=schema.silver_flags(data), device=device, name=config["name"])
    resume = config.get("resume", {}).get(str(config["seed"]))
    if resume is not None:
        restore_checkpoint(trainer, resume)
    started = trainer.step
    for target in [s for s in config["eval_steps"] if s > trainer.step] or [trainer.total]:
        target = min(target, config["stop_step"])
        trainer.run(until=target)
        preds = recipe.predict(trainer.module, *schema.pair_lists(dev)[:2], config["eval_batch_size"])
        score = task_metrics(config["task"], {"dev": preds}, {"dev": dev})["dev"][config["metric"]]
        with tempfile.TemporaryDirectory() as tmp:
            write_checkpoint(trainer, recipe, tmp)
            ray.tune.report(
                {"seed": config["seed"], "step": trainer.step, "total_steps": trainer.total, "dev": score,
                 "resumed_from_step": started, "train_seconds": trainer.seconds},
                checkpoint=ray.tune.Checkpoint.from_directory(tmp),
            )
        if trainer.step >= config["stop_step"]:
            break


def total_steps(n_pairs: int, hparams: dict) -> int:
    from augsbert_ray.training.schedule import steps_per_epoch

    return steps_per_epoch(n_pairs, hparams["batch_size"], 1) * hparams["epochs"]


def seed_search(
    kind: str,
    pairs: pa.Table,
    dev: pa.Table,
    *,
    task: str,
    metric: str,
    recipe: dict,
    hparams: dict,
    plan: SearchPlan,
    storage_dir: Path,
    out_dir: Path,
    name: str,
    eval_batch_size: int = 64,
) -> dict:
    """Runs a seed search for one encoder and copies the chosen model to ``out_dir``.

    Args:
        kind: ``bi_encoder`` or ``cross_encoder`` (see ``recipes.RECIPES``).
        pairs: training pairs; ``dev``: the pairs every trial is scored on.
        task, metric: how dev is scored (``evaluation.task_metrics``; greater is better).
        recipe, hparams: as for ``ray_trainer.train_on_ray``; ``hparams["seed"]`` is replaced
            by each trial's seed.
        plan: seeds, survivors, pruning point, scheduler, audit mode, resources per trial.
        storage_dir: Ray Tune's storage (trial checkpoints and logs).
        out_dir: where the chosen model is written, loadable by sentence-transformers.
        name: names the Tune experiments.

    Returns:
        A record of the search: every trial's dev curve and fate, the chosen seed, the
        steps and seconds spent against training every seed to the end, and in audit
        mode the rank correlation between the pruning-point and final dev rankings.
    """
    from augsbert_ray.runtime import require_resources

    seed_choice.check_keep(plan.keep, len(plan.seeds))

    require_resources([{"CPU": plan.cpus_per_trial, "GPU": plan.gpus_per_trial}],
                      f"a seed-search trial of {name} (seed_search.cpus_per_trial, seed_search.gpus_per_trial)")
    total = total_steps(pairs.num_rows, hparams)
    prune = plan.prune_step(total)
    base = {
        "kind": kind, "name": name, "recipe": recipe, "hparams": hparams, "task": task, "metric": metric,
        "threads": plan.cpus_per_trial, "gpus": plan.gpus_per_trial, "eval_batch_size": eval_batch_size,
    }
    experiments = _Experiments(_trainable(pairs, dev, plan), base, _storage_path(storage_dir), name)

    t0 = time.perf_counter()
    log.info(f"[{name}] seed search: seeds {plan.seeds}, {total} steps each, pruning at step {prune}, "
             f"keeping {plan.keep} ({plan.scheduler}{', audit' if plan.audit else ''})")
    trials = {s: {"seed": s, "curve": [], "status": "pruned"} for s in plan.seeds}
    survivors, at_prune = _run_trials(experiments, trials, plan, prune, total)
    wall = time.perf_counter() - t0

    chosen, final = _settle(trials, plan, survivors, out_dir)
    record_out = _search_record(trials, plan, survivors=survivors, at_prune=at_prune, chosen=chosen, final=final,
                                prune=prune, total=total, wall=wall)
    cost = record_out["cost"]
    log.info(f"[{name}] seed search chose seed {chosen} (dev {final[chosen]:.2f}); "
             f"{cost['search_steps']} of {cost['all_seeds_steps']} steps of training every seed "
             f"({cost['search_fraction']:.0%})")
    return record_out


def _trainable(pairs: pa.Table, dev: pa.Table, plan: SearchPlan):
    """``_trial`` as a Tune trainable with the data in the object store and each trial's resources."""
    import ray.tune

    columns = [schema.SENTENCE1, schema.SENTENCE2, schema.LABEL]
    # with_parameters puts the pairs in the object store once; every trial reads them from there.
    return ray.tune.with_resources(
        ray.tune.with_parameters(_trial, data=pairs.select(schema.training_columns(pairs)), dev=dev.select(columns)),
        {"cpu": plan.cpus_per_trial, "gpu": plan.gpus_per_trial},
    )


def _storage_path(storage_dir: Path) -> str:
    """Tune's storage path: a URI as given, a local directory made absolute."""
    return str(storage_dir) if is_uri(storage_dir) else str(Path(storage_dir).absolute())


@dataclass(frozen=True)
class _Experiments:
    """The search's Tune experiments: one trainable, the config every trial shares, one storage."""

    trainable: object
    base: dict
    storage: str
    name: str

    def fit(self, experiment: str, space: dict, **tune_config) -> list:
        """Runs one Tune experiment; returns its results by seed, or raises a TrainingError for a failed trial."""
        import ray.tune

        t0 = time.perf_counter()
        # reuse_actors: a finished trial's actor takes the next seed, so the imports and the
        # process start are paid once per concurrent trial (each trial seeds its own model).
        tuner = ray.tune.Tuner(
            self.trainable,
            param_space={**self.base, **space},
            tune_config=ray.tune.TuneConfig(reuse_actors=True, **tune_config),
            run_config=ray.tune.RunConfig(name=experiment, storage_path=self.storage, verbose=0),
        )
        grid = tuner.fit()
        _raise_failures(grid, experiment)
        results = sorted(grid, key=lambda r: r.metrics["seed"])
        log.info(f"[{self.name}] {experiment}: {len(results)} trial(s) in {time.perf_counter() - t0:.1f}s")
        return results


def _raise_failures(grid, experiment: str) -> None:
    """Raises a TrainingError for a trial's fatal error (permanent) or a failed trial."""
    fatal = [r.metrics for r in grid if r.error is None and r.metrics.get(FATAL_ERROR)]
    if fatal:
        raise TrainingError(f"seed search {experiment}: seed {fatal[0]['seed']} failed with an error that no retry "
                            f"can fix: {fatal[0][FATAL_ERROR]}", permanent=True)
    if grid.errors:
        cause = getattr(grid.errors[0], "cause", None) or grid.errors[0]
        raise TrainingError(f"seed search {experiment}: {len(grid.errors)} trial(s) failed: "
                            f"{describe_error(cause)}")


def _record(trials: dict, results: list) -> None:
    """Adds each Tune result's dev curve, segment, steps, seconds and checkpoint to its seed's trial."""
    for r in results:
        t = trials[r.metrics["seed"]]
        rows = r.metrics_dataframe[["step", "dev"]].to_dict("records")
        t["curve"] = sorted(t["curve"] + [[int(row["step"]), float(row["dev"])] for row in rows])
        # each Tune trial that trained this seed: the step it started from and where it ended
        t.setdefault("segments", []).append([int(r.metrics["resumed_from_step"]), int(r.metrics["step"])])
        t["steps"] = t["curve"][-1][0]
        t["train_seconds"] = float(r.metrics["train_seconds"])
        t["checkpoint"] = r.checkpoint


def _run_trials(experiments: _Experiments, trials: dict, plan: SearchPlan, prune: int,
                total: int) -> tuple[list, dict]:
    """Runs the search (ASHA, or explore then exploit) into ``trials``; returns the survivors and dev at pruning."""
    import ray.tune

    name = experiments.name
    if plan.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        _record(trials, experiments.fit(
            f"{name}-asha", {"seed": ray.tune.grid_search(plan.seeds), "eval_steps": [prune, total],
                             "stop_step": total},
            scheduler=ASHAScheduler(time_attr="step", metric="dev", mode="max", max_t=total,
                                    grace_period=prune, reduction_factor=max(2, len(plan.seeds) / plan.keep))))
        survivors = [s for s in plan.seeds if trials[s]["steps"] == total]
    else:
        _record(trials, experiments.fit(f"{name}-explore", {"seed": ray.tune.grid_search(plan.seeds),
                                                            "eval_steps": [prune], "stop_step": prune}))
    at_prune = {s: _score_at(trials[s]["curve"], prune) for s in plan.seeds}
    if plan.scheduler == "exact":
        survivors = seed_choice.survivors(at_prune, plan.keep)
        if prune < total:
            _exploit(experiments, trials, plan, at_prune, survivors, prune, total)
    return survivors, at_prune


def _exploit(experiments: _Experiments, trials: dict, plan: SearchPlan, at_prune: dict, survivors: list,
             prune: int, total: int) -> None:
    """Resumes the survivors (every seed in audit mode) from their pruning-point checkpoints to the end."""
    import ray.tune

    continued = plan.seeds if plan.audit else survivors
    log.info(f"[{experiments.name}] dev at step {prune}: "
             + ", ".join(f"seed {s} {at_prune[s]:.2f}" for s in seed_choice.ranked(at_prune))
             + f"; continuing {sorted(survivors)}" + (" (audit: all seeds run to the end)" if plan.audit else ""))
    _record(trials, experiments.fit(f"{experiments.name}-exploit", {
        "seed": ray.tune.grid_search(continued), "resume": {str(s): trials[s]["checkpoint"] for s in continued},
        "eval_steps": [total], "stop_step": total}))


def _settle(trials: dict, plan: SearchPlan, survivors: list, out_dir: Path) -> tuple[int, dict]:
    """Chooses the best survivor, sets every trial's fate, exports the chosen model; returns it and the final dev."""
    final = {s: trials[s]["curve"][-1][1] for s in survivors}
    chosen = seed_choice.chosen(final)
    for s, status in seed_choice.statuses(plan.seeds, survivors, chosen, plan.audit).items():
        trials[s]["status"] = status
    export_model(trials[chosen]["checkpoint"], out_dir)
    return chosen, final


def _search_record(trials: dict, plan: SearchPlan, *, survivors: list, at_prune: dict, chosen: int, final: dict,
                   prune: int, total: int, wall: float) -> dict:
    """The search's record: the plan, every trial, the choice, the cost and, in exact audit mode, the audit."""
    cost = seed_choice.cost(plan.seeds, survivors, prune, total, steps_run=sum(t["steps"] for t in trials.values()),
                            train_seconds=sum(t["train_seconds"] for t in trials.values()), wall_seconds=wall)
    record_out = {
        "seeds": plan.seeds,
        "keep": plan.keep,
        "scheduler": plan.scheduler,
        "audit": plan.audit,
        "total_steps": total,
        "prune_step": prune,
        "chosen_seed": chosen,
        "chosen_dev": final[chosen],
        # each trial's last checkpoint (training state; at the end also the model, in MODEL_DIR)
        "trials": [{**{k: v for k, v in t.items() if k != "checkpoint"}, "checkpoint": t["checkpoint"].path}
                   for t in trials.values()],
        "cost": cost,
    }
    if plan.audit and plan.scheduler == "exact":
        record_out["audit_result"] = seed_choice.audit(at_prune, {s: trials[s]["curve"][-1][1] for s in plan.seeds})
    return record_out


def _score_at(curve: list, step: int) -> float:
    for s, score in curve:
        if s == step:
            return score
    raise ValueError(f"no dev score at step {step} in {curve}")
