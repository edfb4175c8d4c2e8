"""How the encoders train: Ray Train's resources, and the seed search (Ray Tune)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from augsbert_ray.config.fields import Section, Seed, placement


class TrainingConfig(Section):
    """Ray Train resources for both fine-tuning steps."""

    num_workers: int = placement(1, gt=0, description="data-parallel workers; an encoder's batch_size is the global "
                                                      "batch (each worker takes batch_size / num_workers pairs a "
                                                      "step), so more workers do not change the recipe")
    use_gpu: bool = placement(False, description="one GPU per training worker")
    cpus_per_worker: float | None = placement(None, gt=0, description="null: all local CPUs / workers")
    checkpoint_every: float = placement(0.25, ge=0, le=1, description="checkpoint the full training state every "
                                                                      "this fraction of the steps (0: only at the "
                                                                      "end); after a worker or node failure, "
                                                                      "training resumes from the latest checkpoint")
    checkpoint_min_seconds: float = placement(
        30.0, ge=0, description="an intermediate checkpoint is skipped when less than this much training time has "
                                "passed since the last one (or the start), so a short training writes only its "
                                "final checkpoint; a failure then loses at most about this much work (0: every "
                                "checkpoint_every is written)")
    max_failures: int = placement(2, ge=0, description="worker-group restarts before the stage fails")
    precision: Literal["fp32", "bf16", "auto"] = Field(
        "auto", description="bf16: mixed precision (fp32 weights and optimizer, the forward pass autocast to bf16). "
                            "auto: bf16 on a GPU that has it and on CPUs with bf16 matrix instructions (AVX-512 "
                            "BF16 or AMX), fp32 elsewhere, where bf16 would be emulated (benchmarks/training_precision.py "
                            "compares the two)")
    length_grouping: int = Field(
        50, ge=0, description="batches of pairs of similar lengths, so that less of each batch is padding: the "
                              "training pairs are cut into chunks of this many batches, each sorted by length, and "
                              "the batches shuffled (0: random batches; see training.loop.length_grouped_batches)")


class SeedSearchConfig(Section):
    """Seed optimisation (AugSBERT, after Dodge et al. 2020) as Ray Tune trials.

    Every seed trains to ``prune_at`` of its steps and is scored on dev; exactly the best
    ``keep`` resume from their checkpoints and train to the end; the best of those on dev
    is the model. See augsbert_ray/training/seed_search.py.
    """

    enabled: bool = Field(False, description="search seeds instead of training one")
    targets: list[Literal["bi_encoder", "cross_encoder"]] = Field(["bi_encoder"],
                                                                  description="which encoders are searched")
    seeds: PositiveInt | list[Seed] = Field(5, description="a count N (the encoder's seed, seed + 1, ..., "
                                                          "seed + N - 1) or the seeds themselves")
    keep: PositiveInt = Field(1, description="seeds that continue past the pruning point")
    prune_at: float = Field(0.2, gt=0, le=1, description="fraction of the training steps at which seeds are scored")
    scheduler: Literal["exact", "asha"] = Field(
        "exact", description="exact: the paper's semantics (all seeds scored, then exactly keep continue); asha: "
                             "Ray Tune's asynchronous ASHA, cheaper to schedule, but the number that survive varies")
    audit: bool = Field(False, description="also train the pruned seeds to the end and report how well the early "
                                           "ranking held")
    cpus_per_trial: float | None = placement(None, gt=0, description="null: the cluster's CPUs / seeds, at least 1")
    gpus_per_trial: float | None = placement(None, ge=0, description="null: 1 when training.use_gpu, else 0")

    @model_validator(mode="after")
    def _check(self) -> "SeedSearchConfig":
        n = self.seeds if isinstance(self.seeds, int) else len(self.seeds)
        if not isinstance(self.seeds, int) and len(set(self.seeds)) != n:
            raise ValueError(f"seeds: {self.seeds} repeats a seed")
        if n == 0:
            raise ValueError("seeds: give at least one seed")
        if self.keep > n:
            raise ValueError(f"keep: {self.keep} is more than the {n} seeds searched")
        if self.audit and self.scheduler != "exact":
            raise ValueError("audit: needs scheduler: exact (ASHA decides survivors as trials report)")
        return self

    def seed_list(self, base: int) -> list[int]:
        return [base + i for i in range(self.seeds)] if isinstance(self.seeds, int) else list(self.seeds)
