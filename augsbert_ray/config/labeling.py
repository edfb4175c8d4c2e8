"""Step 2.2: how the cross-encoder's actor pool labels the candidates."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from augsbert_ray.config.fields import Section, placement


class LabelingConfig(Section):
    """Step 2.2: the cross-encoder scores candidates in a Ray Data actor pool."""

    actors: int | None = placement(None, gt=0, description="actor pool size; null: one per num_gpus GPUs of the "
                                                           "cluster when actors have GPUs, else 1")
    num_gpus: float = placement(0, ge=0, description="GPUs per actor; 0 runs on CPU")
    num_cpus: float | None = placement(None, gt=0, description="CPUs per actor; null: all local CPUs / actors")
    block_size: int = placement(0, ge=0, description="pairs per shard: one Ray Data batch, committed on its own. "
                                                     "0: 1024 on CPU, 16384 when the actors have GPUs (a GPU scores a "
                                                     "small batch faster than Ray Data hands it over)")
    micro_batch_size: int = placement(4096, gt=0, description="most pairs per forward pass (pairs are sorted by "
                                                              "length)")
    token_budget: int = placement(0, ge=0, description="most padded tokens (pairs x longest pair) per forward "
                                                       "pass; 0: 2048 on CPU, 65536 on a GPU")
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] = Field(
        "auto", description="auto: bf16 on a GPU (fp16 where bf16 is missing); on CPU, bf16 where the CPU has bf16 "
                            "matrix instructions (AVX-512 BF16 or AMX), else fp32. int8 (dynamic quantisation of the "
                            "linear layers, CPU) moves the teacher's scores more than bf16, so it is opt-in; "
                            "benchmarks/labeling_speed.py measures each against fp32")
    calibration: Literal["none", "isotonic"] = Field(
        "none", description="map the teacher's scores to the gold scale before the student trains on them: "
                            "isotonic regression of gold labels on the teacher's dev scores (a sigmoid teacher "
                            "compresses the scale); none: the scores as they are")
    compile: bool = placement(False, description="torch.compile the cross-encoder (slow first batches; helps on long "
                                                 "runs)")
    tokenize_stage: Literal["auto", "actor", "separate"] = placement(
        "auto", description="auto: tokenise in CPU tasks ahead of the actors when they run on GPUs, in the actors "
                            "on CPU")
    executor: Literal["auto", "pool", "hosts"] = placement(
        "auto", description="what labels: pool: a Ray Data actor pool started for the stage; hosts: the job's warm "
                            "hosts, which hold the imports (and the CUDA context) of the stages before, so labelling "
                            "starts at once (only when hosts serve the job: one machine, at most one GPU); auto: "
                            "hosts up to 200,000 pairs to label, a pool above")
    # The three retry limits below stack: actor restarts, then task retries, then a new pool.
    max_restarts: int = placement(4, ge=-1, description="a labelling actor that dies (node lost, OOM) is restarted "
                                                        "up to this many times (-1: without limit)")
    max_task_retries: int = placement(4, ge=-1, description="a dead actor's batch is retried up to this many times "
                                                            "(-1: without limit)")
    pool_retries: int = placement(2, ge=0, description="if the pool still fails, a new pool labels the shards not "
                                                       "yet committed, up to this many times; then the stage fails, "
                                                       "keeping the committed shards for a re-run")

    @model_validator(mode="after")
    def _auto_block_size(self):
        if self.block_size == 0:
            self.block_size = 16384 if self.num_gpus > 0 else 1024
        return self
