"""Fault injection for the chaos tests. The engine itself never imports this module.

Labelling: a test swaps the labelling pool's actor class for one made here::

    monkeypatch.setattr(augsbert_ray.labeling.pool, "PairScorer", dying_scorer(2, flag))

Training: ``inject_training_fault(monkeypatch, F)`` makes every later ``train_on_ray`` of the
test's process run its workers through ``FaultyTraining``, which calls ``F(rank)`` in each
training worker (or warm host) and runs the hook it returns after every optimizer step. The
hooks here are plain picklable objects, so they reach a worker in another process with the
training function.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from augsbert_ray.labeling.scorer import PairScorer


def dying_scorer(after_batches: int, flag: str | os.PathLike) -> type[PairScorer]:
    """A ``PairScorer`` whose process exits (``os._exit(1)``, no clean-up) once, mid-batch.

    The first actor to score its ``after_batches``-th batch while ``flag`` does not exist
    writes ``flag`` and dies with that batch scored but not returned, as a node lost or an
    actor killed for memory would. The class is made inside this function, so Ray ships it
    to the actors by value, settings included.

    Args:
        after_batches: the batch (counted per actor) after which the actor dies.
        flag: a file on a file system every actor sees; once it exists, no actor dies.

    Returns:
        A subclass of ``PairScorer`` for ``map_batches``.
    """
    flag = str(flag)

    class DyingPairScorer(PairScorer):
        batches = 0

        def score(self, batch):
            out = super().score(batch)
            self.batches += 1
            if self.batches >= after_batches and not os.path.exists(flag):
                Path(flag).write_text(f"actor pid {os.getpid()} exited after {self.batches} batches\n")
                os._exit(1)
            return out

    return DyingPairScorer


def failing_scorer(flag: str | os.PathLike, message: str) -> type[PairScorer]:
    """A ``PairScorer`` whose first batch raises ``RuntimeError(message)``, once across actors (the
    ``flag`` file records it), as a model given a pair it cannot take would: the pool fails, and
    its actor stays up, holding its CPUs, until it is ended."""
    flag = str(flag)

    class FailingPairScorer(PairScorer):
        def score(self, batch):
            if not os.path.exists(flag):
                Path(flag).write_text(f"actor pid {os.getpid()} raised\n")
                raise RuntimeError(message)
            return super().score(batch)

    return FailingPairScorer


@dataclass(frozen=True)
class CrashAt:
    """The worker of ``rank`` exits hard after ``step``, once: the ``flag`` file records that
    the fault fired, so the restarted worker trains on."""

    rank: int
    step: int
    flag: str

    def __call__(self, rank: int):
        if rank != self.rank:
            return None

        def hook(step: int) -> None:
            flag = Path(self.flag)
            if step == self.step and not flag.exists():
                flag.write_text(str(step))
                os._exit(1)  # a crash, not an exception: no cleanup, no report

        return hook


@dataclass(frozen=True)
class RaiseAt:
    """The worker of ``rank`` raises ``ValueError(message)`` after ``step`` on every attempt (an
    error no retry can fix); each attempt adds a line to the ``flag`` file."""

    rank: int
    step: int
    flag: str
    message: str

    def __call__(self, rank: int):
        if rank != self.rank:
            return None

        def hook(step: int) -> None:
            if step == self.step:
                with Path(self.flag).open("a") as f:
                    f.write(f"{step}\n")
                raise ValueError(self.message)

        return hook


@dataclass(frozen=True)
class Slowed:
    """Every worker sleeps ``delay_s`` after each step, so a test can stop a run part-way."""

    delay_s: float

    def __call__(self, rank: int):
        return lambda step: time.sleep(self.delay_s)


@dataclass(frozen=True)
class FaultyTraining:
    """The training workers' function (``ray_trainer._train_loop_per_worker``) with ``fault``'s
    hook run after every optimizer step of the worker's rank. It is handed to the executor in
    the function's place, so it travels to the worker (or warm host) with its fault."""

    fault: Callable[[int], Callable[[int], None] | None]

    def __call__(self, config: dict) -> None:
        import ray.train

        from augsbert_ray.training import loop, ray_trainer

        hook = self.fault(ray.train.get_context().get_world_rank())
        run = loop.PairTrainer.run

        def run_with_fault(trainer, until=None, after_step=None):
            def both(step: int) -> None:
                hook(step)
                if after_step is not None:
                    after_step(step)

            return run(trainer, until=until, after_step=both if hook is not None else after_step)

        loop.PairTrainer.run = run_with_fault
        try:  # the module's own function: a warm host's process imported it, unpatched
            ray_trainer._train_loop_per_worker(config)
        finally:
            loop.PairTrainer.run = run  # a warm host trains other stages after this one


def inject_training_fault(monkeypatch, fault) -> None:
    """Every ``train_on_ray`` of this process, until ``monkeypatch`` undoes it, runs its workers
    through ``FaultyTraining(fault)`` (e.g. ``CrashAt``, ``RaiseAt``, ``Slowed``)."""
    from augsbert_ray.training import ray_trainer

    monkeypatch.setattr(ray_trainer, "_train_loop_per_worker", FaultyTraining(fault))


def slow_training(delay_s: float) -> None:
    """Slows every training of this process's jobs down (``Slowed``): for a job run in a
    process of a test's own, e.g. ``python -c "...; slow_training(0.5); main()"``."""
    from augsbert_ray.training import ray_trainer

    ray_trainer._train_loop_per_worker = FaultyTraining(Slowed(delay_s))
