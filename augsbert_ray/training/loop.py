"""A plain, seeded fine-tuning loop over sentence pairs, shared by both encoders.

It runs the same inside a Ray Train worker and in a test: the Ray edge
(``ray_trainer.py``) only supplies the rank, the world size, the device and a
function that wraps the model for data-parallel training.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from augsbert_ray.training.recipes import Recipe


@dataclass(frozen=True)
class HParams:
    epochs: int
    lr: float
    batch_size: int  # per worker
    warmup_ratio: float
    seed: int
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def shard_order(n: int, epoch: int, seed: int, rank: int, world: int) -> np.ndarray:
    """Row indices this rank trains on in ``epoch``: a seeded permutation, strided by rank.

    The permutation is padded by wrapping around (as torch's DistributedSampler does) so
    every rank takes the same number of steps, which data-parallel training requires.
    """
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    per_rank = math.ceil(n / world)
    perm = np.resize(perm, per_rank * world)  # repeats from the start to pad
    return perm[rank::world]


def steps_per_epoch(n: int, batch_size: int, world: int) -> int:
    return math.ceil(math.ceil(n / world) / batch_size)


def train_pairs(
    recipe: Recipe,
    s1: list[str],
    s2: list[str],
    labels: np.ndarray,
    hp: HParams,
    *,
    device: str = "cpu",
    rank: int = 0,
    world: int = 1,
    wrap: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m,
    log: Callable[[str], None] = print,
    name: str = "model",
) -> tuple[torch.nn.Module, dict]:
    """Fine-tunes ``recipe``'s model on labelled pairs.

    Args:
        recipe: builds the model and computes the loss of a batch.
        s1, s2, labels: the training pairs (labels in [0, 1]).
        hp: optimisation hyperparameters; ``hp.seed`` fixes initialisation and data order.
        device, rank, world: where this worker runs and its place in data-parallel training.
        wrap: wraps the built model for data parallelism (identity on one worker).
        log: receives progress lines (about ten per epoch).
        name: shown in the progress lines.

    Returns:
        The trained model (as wrapped) and a dict of statistics (steps, final loss, pairs/s).
    """
    torch.manual_seed(hp.seed)
    np_labels = np.asarray(labels, dtype=np.float32)
    n = len(np_labels)
    if n == 0:
        raise ValueError(f"{name}: no training pairs")
    module = wrap(recipe.build(device))
    module.train()
    # The fused AdamW kernel is about 25% faster per step on CPU than the default one.
    optimizer = torch.optim.AdamW(module.parameters(), lr=hp.lr, weight_decay=hp.weight_decay, fused=True)
    per_epoch = steps_per_epoch(n, hp.batch_size, world)
    total = per_epoch * hp.epochs
    warmup = int(total * hp.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _linear_warmup_decay(s, warmup, total))
    log_every = max(1, total // 10)
    step, started, running = 0, time.perf_counter(), []
    for epoch in range(hp.epochs):
        order = shard_order(n, epoch, hp.seed, rank, world)
        for start in range(0, len(order), hp.batch_size):
            idx = order[start : start + hp.batch_size]
            batch_labels = torch.from_numpy(np_labels[idx]).to(device)
            loss = recipe.loss(module, [s1[i] for i in idx], [s2[i] for i in idx], batch_labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), hp.max_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            running.append(loss.item())
            if step % log_every == 0 or step == total:
                rate = step * hp.batch_size * world / (time.perf_counter() - started)
                log(
                    f"[{name}] epoch {epoch + 1}/{hp.epochs} step {step}/{total} "
                    f"loss {np.mean(running[-log_every:]):.4f} ({rate:.1f} pairs/s)"
                )
    seconds = time.perf_counter() - started
    stats = {
        "steps": step,
        "train_pairs": n,
        "final_loss": float(np.mean(running[-log_every:])),
        "seconds": seconds,
        "pairs_per_s": step * hp.batch_size * world / seconds,
    }
    return module, stats


def _linear_warmup_decay(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total - step) / max(1, total - warmup))
