"""Pilots: short trainings of the student that predict which training set serves it best.

Each pilot trains the bi-encoder on one training set for a fraction of the steps a full run
on that set would take (the learning-rate schedule is the full run's, as in the seed search:
the pilot is the full run stopped early) and scores it on dev. Pilots run as Ray Tune trials,
in parallel as far as the resources per trial allow, within an optional time budget (a
pilot that did not end within it has no score).

The job uses them twice: as a predicting teacher check (gold alone against gold + silver:
does the silver help?) and in the autopilot (which teacher, strategy, amount of silver and
calibration to train to the end).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from augsbert_ray import schema


@dataclass(frozen=True)
class PilotResult:
    """One pilot: its dev score after ``steps`` of the ``total_steps`` of a full run."""

    name: str
    dev: float | None  # None: the pilot did not end (time budget, or it failed), or its score is undefined
    steps: int
    total_steps: int
    train_pairs: int
    seconds: float
    # Its prediction for every dev pair, in dev's order (for comparing pilots pair by pair); not
    # part of ``record()``.
    preds: tuple[float, ...] | None = field(default=None, repr=False, compare=False)

    def record(self) -> dict:
        """The pilot as a report records it (without its predictions)."""
        out = asdict(self)
        del out["preds"]
        return out


def pilot_steps(n_pairs: int, hparams: dict, fraction: float) -> tuple[int, int]:
    """(steps a pilot trains, steps of the full run) for ``n_pairs`` training pairs."""
    from augsbert_ray.training.schedule import steps_per_epoch

    total = steps_per_epoch(n_pairs, hparams["batch_size"], 1) * hparams["epochs"]
    return min(total, max(1, math.ceil(fraction * total))), total


def _pilot(config: dict, tables: dict, dev: pa.Table | dict, steps: dict) -> None:
    """One pilot as a Tune function trainable: train ``steps[config["pilot"]]``, score its dev
    set (``dev``, or ``dev[pilot]`` for a pilot with its own), report."""
    import ray.tune
    import torch

    from augsbert_ray.evaluation import task_metrics
    from augsbert_ray.training.loop import HParams, PairTrainer
    from augsbert_ray.training.recipes import make_recipe

    torch.set_num_threads(max(1, int(config["threads"])))
    device = "cuda" if config["gpus"] and torch.cuda.is_available() else "cpu"
    data = tables[config["pilot"]]
    if isinstance(dev, dict):
        dev = dev[config["pilot"]]
    objective = config["objectives"].get(config["pilot"])
    recipe = make_recipe(config["kind"], **{**config["recipe"], **({"objective": objective} if objective else {})})
    trainer = PairTrainer(recipe, *schema.pair_lists(data), HParams(**config["hparams"]),
                          silver=schema.silver_flags(data), device=device, name=config["pilot"])
    t0 = time.perf_counter()
    trainer.run(until=steps[config["pilot"]])
    preds = recipe.predict(trainer.module, *schema.pair_lists(dev)[:2], config["eval_batch_size"])
    score = task_metrics(config["task"], {"dev": preds}, {"dev": dev})["dev"][config["metric"]]
    ray.tune.report({"pilot": config["pilot"], "dev": score, "steps": trainer.step, "total_steps": trainer.total,
                     "seconds": time.perf_counter() - t0, "preds": [float(x) for x in preds]})


def run_pilots(training_sets: dict[str, pa.Table], dev: pa.Table | dict[str, pa.Table], *, kind: str,
               recipe: dict, hparams: dict,
               fraction: float, task: str, metric: str, cpus_per_trial: float, gpus_per_trial: float,
               storage_dir: str, name: str, eval_batch_size: int = 64,
               time_budget_s: float | None = None, objectives: dict[str, str] | None = None) -> dict[str, PilotResult]:
    """Trains one pilot per training set and scores each on dev.

    Args:
        training_sets: pilot name -> its training pairs (``sentence1``, ``sentence2``, ``label``).
        dev: the pairs every pilot is scored on, or pilot name -> the pairs that pilot is scored
            on (held-out folds).
        kind, recipe, hparams: what is trained, as for ``ray_trainer.train_on_ray``.
        fraction: of a full run's steps that a pilot trains.
        task, metric: how dev is scored (greater is better).
        cpus_per_trial, gpus_per_trial: resources of one pilot.
        storage_dir: Ray Tune's storage; name: the Tune experiment's name.
        time_budget_s: pilots still running after this long are stopped (no score).
        objectives: pilot name -> the objective its recipe trains with instead of ``recipe``'s.

    Returns:
        name -> ``PilotResult`` (``dev`` None for a pilot that did not end or whose score is
        undefined: a model that scored every dev pair the same; ``preds`` None for one that did
        not end).
    """
    import ray.tune

    from augsbert_ray.runtime import require_resources

    require_resources([{"CPU": cpus_per_trial, "GPU": gpus_per_trial}],
                      "a pilot training (training.cpus_per_worker, training.use_gpu)")
    columns = [schema.SENTENCE1, schema.SENTENCE2, schema.LABEL]
    tables = {k: t.select(schema.training_columns(t)) for k, t in training_sets.items()}
    steps = {k: pilot_steps(t.num_rows, hparams, fraction) for k, t in tables.items()}
    dev = {k: d.select(columns) for k, d in dev.items()} if isinstance(dev, dict) else dev.select(columns)
    trainable = ray.tune.with_resources(
        ray.tune.with_parameters(_pilot, tables=tables, dev=dev, steps={k: v[0] for k, v in steps.items()}),
        {"cpu": cpus_per_trial, "gpu": gpus_per_trial})
    space = {"kind": kind, "recipe": recipe, "hparams": hparams, "task": task, "metric": metric,
             "threads": cpus_per_trial, "gpus": gpus_per_trial, "eval_batch_size": eval_batch_size,
             "objectives": dict(objectives or {}), "pilot": ray.tune.grid_search(list(tables))}
    # reuse_actors: a trial's actor runs the next trial, so torch and transformers are imported
    # once per concurrent pilot, not once per pilot (every trial builds its own model and seed).
    tuner = ray.tune.Tuner(trainable, param_space=space,
                           tune_config=ray.tune.TuneConfig(time_budget_s=time_budget_s, reuse_actors=True),
                           run_config=ray.tune.RunConfig(name=name, storage_path=storage_dir, verbose=0))
    grid = tuner.fit()
    out = {k: PilotResult(k, None, 0, steps[k][1], tables[k].num_rows, 0.0) for k in tables}
    for r in grid:
        if r.error is None and r.metrics and "dev" in r.metrics:
            m = r.metrics
            dev = None if math.isnan(float(m["dev"])) else float(m["dev"])  # NaN: it scored every pair the same
            out[m["pilot"]] = PilotResult(m["pilot"], dev, int(m["steps"]), int(m["total_steps"]),
                                          tables[m["pilot"]].num_rows, float(m["seconds"]),
                                          tuple(float(x) for x in m["preds"]))
    return out
