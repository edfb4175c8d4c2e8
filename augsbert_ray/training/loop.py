"""A plain, seeded fine-tuning loop over sentence pairs, shared by both encoders.

It runs the same inside a Ray Train worker and in a test: the Ray edge
(``ray_trainer.py``) only supplies the rank, the world size, the device and a
function that wraps the model for data-parallel training.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from augsbert_ray.errors import TrainingError
from augsbert_ray.tracking.points import POINT
from augsbert_ray.training.batches import to_device
from augsbert_ray.training.recipes import Recipe, unwrap
from augsbert_ray.training.schedule import rank_batch_size, steps_per_epoch  # noqa: F401 - part of this module's API

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HParams:
    epochs: int
    lr: float
    batch_size: int  # the global batch (split over data-parallel workers: rank_batch_size)
    warmup_ratio: float
    seed: int
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    precision: str = "fp32"  # see TRAINING_PRECISIONS and resolve_training_precision
    # Batches of similar lengths (see length_grouped_batches): 0 keeps random batches.
    length_grouping: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


TRAINING_PRECISIONS = ("fp32", "bf16", "auto")


def resolve_training_precision(precision: str, device: str) -> str:
    """The precision a worker on ``device`` trains in.

    ``bf16`` is mixed precision: the weights, the optimizer state and the gradients stay in
    fp32 and the forward pass runs under ``torch.autocast`` in bf16 (no loss scaling is needed,
    bf16 has fp32's range). ``auto``: bf16 on a GPU that has it, and on a CPU with bf16 matrix
    instructions (AVX-512 BF16 or AMX); fp32 elsewhere, where bf16 would be emulated.
    """
    from augsbert_ray.scoring import cpu_has_bf16

    if precision not in TRAINING_PRECISIONS:
        raise ValueError(f"training precision must be one of {TRAINING_PRECISIONS}, not {precision!r}")
    if precision != "auto":
        return precision
    if str(device).startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_bf16() else "fp32"


def shard_order(n: int, epoch: int, seed: int, rank: int, world: int) -> np.ndarray:
    """Row indices this rank trains on in ``epoch``: a seeded permutation, strided by rank.

    The permutation is padded by wrapping around (as torch's DistributedSampler does) so
    every rank takes the same number of steps, which data-parallel training requires.

    It is ``np.random.default_rng([seed, epoch]).permutation(n)``, drawn as 4-byte indices
    (``Generator.shuffle`` draws the same swaps whatever the dtype), and only this rank's part is
    kept: a worker holds 4 bytes a row while drawing it, then 4 bytes a row / ``world``.
    """
    perm = np.arange(n, dtype=index_dtype(n))
    np.random.default_rng([seed, epoch]).shuffle(perm)
    mine = perm[rank::world]
    last = rank + (math.ceil(n / world) - 1) * world  # the rank's last position in the padded order
    if last < n:
        return mine.copy()  # not a view: the whole permutation is freed
    return np.concatenate([mine, perm[last % n:last % n + 1]])  # padded by repeating from the start


def index_dtype(n: int):
    """The smallest index type for ``n`` rows that ``recipes``' ``batch_rows`` (rows up to 2n) can add to."""
    return np.int32 if 2 * n < 2**31 else np.int64


class EpochBatches(Sequence):
    """An epoch's batches: batch ``k`` is ``rows[at[k] * size:(at[k] + 1) * size]``, a view made
    when it is read, so an epoch costs its row indices and one index per batch, not an array
    object per batch."""

    def __init__(self, rows: np.ndarray, size: int, at: np.ndarray | None = None):
        self.rows, self.size = rows, size
        self.at = at

    def __len__(self) -> int:
        return (len(self.rows) + self.size - 1) // self.size

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        start = (int(self.at[k]) if self.at is not None else k) * self.size
        return self.rows[start:start + self.size]


def length_grouped_batches(order: np.ndarray, lengths: np.ndarray | None, batch: int, group: int,
                           seed: int, epoch: int) -> EpochBatches:
    """An epoch's batches: ``order`` cut into batches of ``batch`` rows, with rows of similar
    lengths put together when ``group`` > 0.

    A batch is padded to its longest pair, so random batches of short sentences carry a lot
    of padding (STSb's: 2.2 padded tokens per real one, with batches of 16). With grouping,
    ``order`` is cut into chunks of ``group`` batches, each chunk is sorted by length and cut
    into batches, and the batches are then shuffled (seeded by ``seed`` and ``epoch``), so an
    epoch still sees its pairs in a random order of batches (1.04 padded tokens per real one
    at ``group`` 50). The grouping of Hugging Face's ``group_by_length``, made deterministic.
    """
    if group <= 0 or lengths is None:
        return EpochBatches(order, batch)
    chunk = batch * group
    grouped = np.empty_like(order)
    for i in range(0, len(order), chunk):
        c = order[i:i + chunk]
        grouped[i:i + len(c)] = c[np.argsort(lengths[c], kind="stable")]
    at = np.random.default_rng([seed, epoch, 7]).permutation(-(-len(grouped) // batch))
    return EpochBatches(grouped, batch, at)


class PairTrainer:
    """Fine-tunes ``recipe``'s model on labelled pairs, in steps that can stop and resume.

    ``run(until=s)`` trains up to global step ``s``; ``save_state``/``load_state`` carry
    the whole training state (weights, optimizer, schedule, step, RNG), so a run stopped
    at step s and resumed in another process continues exactly as one that never stopped.

    Args:
        recipe: builds the model and computes the loss of a batch.
        s1, s2, labels: the training pairs (labels in [0, 1]), held here and tokenised once;
            all three None when ``rows`` streams them.
        hp: optimisation hyperparameters; ``hp.seed`` fixes initialisation and data order.
        silver: per pair, whether the teacher labelled it (a student's training set), handed
            to the recipe's loss with each batch; None where the pairs do not say.
        device, rank, world: where this worker runs and its place in data-parallel training.
        wrap: wraps the built model for data parallelism (identity on one worker).
        name: shown in the progress lines (about ten per run, logged to this module's logger).
        rows: a staged training set's reader (``ingest.PairReader``): each step reads and
            tokenises its batch's pairs there, and nothing per pair is held but the indices of
            the epoch's batches and, with length grouping, the token lengths. The batches, and
            so the weights, are those of the same pairs given as ``s1``, ``s2``, ``labels``.
        lengths_key: what identifies the recipe's tokenisation, naming ``rows``' cached token
            lengths (``ingest.PairReader.lengths``).
    """

    def __init__(
        self,
        recipe: Recipe,
        s1: list[str] | None,
        s2: list[str] | None,
        labels: np.ndarray | None,
        hp: HParams,
        *,
        silver: np.ndarray | None = None,
        device: str = "cpu",
        rank: int = 0,
        world: int = 1,
        wrap: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m,
        name: str = "model",
        rows=None,
        lengths_key: dict | None = None,
    ):
        self.recipe, self.s1, self.s2, self.hp, self.rows = recipe, s1, s2, hp, rows
        self.labels = None if rows is not None else np.asarray(labels, dtype=np.float32)
        self.n = len(rows) if rows is not None else len(self.labels)
        self.silver = None if silver is None else np.asarray(silver, dtype=bool)
        if self.silver is not None and len(self.silver) != self.n:
            raise ValueError(f"{name}: {len(self.silver)} silver flags for {self.n} pairs")
        self.device, self.rank, self.world, self.name = device, rank, world, name
        if self.n == 0:
            raise ValueError(f"{name}: no training pairs")
        self.precision = resolve_training_precision(hp.precision, device)
        torch.manual_seed(hp.seed)
        self.module = wrap(recipe.build(device))
        self.module.train()
        # The fused AdamW kernel does one pass over the parameters per step instead of several.
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=hp.lr, weight_decay=hp.weight_decay, fused=True)
        self.rank_batch = rank_batch_size(hp.batch_size, world)
        # Every pair tokenised once (the steps then only pad), where the recipe can and holds them.
        self.tokens = recipe.pretokenize(s1, s2) if hasattr(recipe, "pretokenize") and rows is None else None
        # Pairs' token lengths, for batches of similar lengths (length_grouped_batches).
        self.lengths = None
        if hp.length_grouping > 0:
            self.lengths = rows.lengths(recipe, lengths_key or {}, rank) if rows is not None \
                else self._pair_lengths(s1, s2)
        self._epoch_batches: tuple[int, EpochBatches] | None = None
        self.per_epoch = steps_per_epoch(self.n, self.rank_batch, world)
        self.total = self.per_epoch * hp.epochs
        warmup = int(self.total * hp.warmup_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: _linear_warmup_decay(s, warmup, self.total)
        )
        self.log_every = max(1, self.total // 10)
        self.step = 0
        self.seconds = 0.0  # training time over every run() so far, across resumes
        self.losses: list[float] = []  # the last log_every losses
        # Losses of the steps since they were last read, kept on the device: reading a loss
        # waits for its step to finish, so they are read at log points and checkpoints only.
        self._pending: list[torch.Tensor] = []

    def run(self, until: int | None = None, after_step: Callable[[int], None] | None = None) -> None:
        """Trains from the current step up to global step ``until`` (default: the end).

        ``after_step(step)`` is called after every optimizer step (a hook for fault injection).
        """
        until = self.total if until is None else min(until, self.total)
        hp = self.hp
        started, first = time.perf_counter(), self.step
        while self.step < until:
            epoch, in_epoch = divmod(self.step, self.per_epoch)
            idx = self._batches(epoch)[in_epoch]
            loss = self._loss(idx).float()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), hp.max_grad_norm)
            self.optimizer.step()
            lr = self.optimizer.param_groups[0]["lr"]  # this step's, before the schedule moves on
            self.scheduler.step()
            self.step += 1
            if after_step is not None:
                after_step(self.step)
            self._pending = (self._pending + [loss.detach()])[-self.log_every :]
            if self.step % self.log_every == 0 or self.step == self.total:
                self._read_losses()
                rate = (self.step - first) * self.rank_batch * self.world / (time.perf_counter() - started)
                mean_loss = float(np.mean(self.losses))
                # the point rides on the line: a tracking run records it on the driver (tracking.points)
                log.info(
                    f"[{self.name}] epoch {epoch + 1}/{hp.epochs} step {self.step}/{self.total} "
                    f"loss {mean_loss:.4f} ({rate:.1f} pairs/s{', bf16' * (self.precision == 'bf16')})",
                    extra={POINT: {"model": self.name, "step": self.step, "epoch": epoch + 1, "loss": mean_loss,
                                   "lr": float(lr)}},
                )
        self.seconds += time.perf_counter() - started

    def _loss(self, idx: np.ndarray) -> torch.Tensor:
        """The loss of the batch of pairs ``idx`` (pre-tokenised where the recipe can)."""
        if self.rows is not None:
            return self._streamed_loss(idx)
        given = to_device({"labels": torch.from_numpy(self.labels[idx]),
                           "silver": None if self.silver is None else torch.from_numpy(self.silver[idx])}, self.device)
        labels, silver = given["labels"], given["silver"]
        with torch.autocast(torch.device(self.device).type, torch.bfloat16, enabled=self.precision == "bf16"):
            if self.tokens is None:
                return self.recipe.loss(self.module, [self.s1[i] for i in idx], [self.s2[i] for i in idx], labels,
                                        silver=silver)
            features = to_device(self.tokens.batch(self.recipe.batch_rows(idx, len(self.labels))), self.device)
            return self.recipe.features_loss(self.module, features, labels, silver=silver)

    def _streamed_loss(self, idx: np.ndarray) -> torch.Tensor:
        """The loss of the batch ``idx`` read from ``rows`` and tokenised together: the tensors
        of the same rows pre-tokenised and padded (``batches``), so the same loss."""
        s1, s2, labels, silver = self.rows.fetch(idx)
        given = to_device({"labels": torch.from_numpy(labels),
                           "silver": None if silver is None else torch.from_numpy(silver)}, self.device)
        with torch.autocast(torch.device(self.device).type, torch.bfloat16, enabled=self.precision == "bf16"):
            return self.recipe.loss(self.module, s1, s2, given["labels"], silver=given["silver"])

    def _read_losses(self) -> None:
        """Moves the losses kept on the device into ``losses`` (one wait for the device).

        Raises:
            TrainingError: a loss is NaN or infinite (naming the first such step). Every log
                point and every checkpoint reads them first, so a diverged model is never saved.
        """
        if self._pending:
            read = torch.stack(self._pending).tolist()
            bad = [k for k, loss in enumerate(read) if not math.isfinite(loss)]
            if bad:
                step = self.step - len(read) + bad[0] + 1
                raise TrainingError(
                    f"{self.name}: the training loss is {read[bad[0]]} at step {step}/{self.total} (epoch "
                    f"{(step - 1) // self.per_epoch + 1}): the training diverged; lower the learning rate (lr) or "
                    f"check the labels", permanent=True)
            self.losses = (self.losses + read)[-self.log_every :]
            self._pending = []

    def _pair_lengths(self, s1: list[str], s2: list[str]) -> np.ndarray | None:
        """Each pair's padded length in a batch: from the pre-tokenised rows where there are
        some (the longest of a pair's rows), else from the recipe, which tokenises again."""
        if self.tokens is not None:
            return pair_lengths(self.recipe, self.tokens, self.n)
        lengths = getattr(self.recipe, "lengths", None)
        return lengths(s1, s2) if lengths is not None else None

    def _batches(self, epoch: int) -> EpochBatches:
        """This rank's batches of ``epoch`` (a function of the seed and the epoch alone, so a
        resumed run takes the same batches as one that never stopped)."""
        if self._epoch_batches is None or self._epoch_batches[0] != epoch:
            order = shard_order(self.n, epoch, self.hp.seed, self.rank, self.world)
            self._epoch_batches = (epoch, length_grouped_batches(order, self.lengths, self.rank_batch,
                                                                 self.hp.length_grouping, self.hp.seed, epoch))
        return self._epoch_batches[1]

    def stats(self) -> dict:
        self._read_losses()
        return {
            "precision": self.precision,
            "steps": self.step,
            "train_pairs": self.n,
            "final_loss": float(np.mean(self.losses)) if self.losses else None,
            "seconds": self.seconds,
            "pairs_per_s": self.step * self.rank_batch * self.world / self.seconds if self.seconds else None,
        }

    def save_state(self, path: str | os.PathLike) -> None:
        """Writes the full training state (tensors and numbers only) to ``path``. Once training
        has ended the optimizer's and scheduler's states are left out: no step will read them,
        and the optimizer's are twice the model's size."""
        self._read_losses()
        ended = self.step >= self.total
        state = {
            "module": unwrap(self.module).state_dict(),
            **({} if ended else {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}),
            "step": self.step,
            "seconds": self.seconds,
            "losses": list(self.losses),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        torch.save(state, path)

    def load_state(self, path: str | os.PathLike) -> None:
        """Restores a state written by ``save_state`` (read with ``weights_only``: no code runs)."""
        state = torch.load(path, map_location=self.device, weights_only=True)
        if "optimizer" not in state and int(state["step"]) < self.total:
            raise ValueError(f"{path}: the state of a training that ended at step {int(state['step'])} cannot "
                             f"continue a training of {self.total} steps")
        unwrap(self.module).load_state_dict(state["module"])
        if "optimizer" in state:  # absent once training has ended (see save_state)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.seconds, self.losses = int(state["step"]), float(state["seconds"]), list(state["losses"])
        self._pending = []
        torch.set_rng_state(state["torch_rng"].cpu())
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])


def pair_lengths(recipe: Recipe, tokens, n: int) -> np.ndarray:
    """The padded length in a batch of each of ``n`` pairs pre-tokenised as ``tokens``
    (``recipe.pretokenize``): the longest of the rows that hold the pair."""
    return tokens.lengths[recipe.batch_rows(np.arange(n), n)].reshape(-1, n).max(axis=0)


def train_pairs(recipe: Recipe, s1: list[str], s2: list[str], labels: np.ndarray, hp: HParams,
                **kwargs) -> tuple[torch.nn.Module, dict]:
    """Fine-tunes ``recipe``'s model on labelled pairs from start to end (see ``PairTrainer``).

    Returns:
        The trained model (as wrapped) and a dict of statistics (steps, final loss, pairs/s).
    """
    trainer = PairTrainer(recipe, s1, s2, labels, hp, **kwargs)
    trainer.run()
    return trainer.module, trainer.stats()


# Kept by hand: transformers' get_linear_schedule_with_warmup gives step / warmup in warmup (a
# first step at lr 0) where this gives (step + 1) / (warmup + 1); switching would change every model.
def _linear_warmup_decay(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total - step) / max(1, total - warmup))
