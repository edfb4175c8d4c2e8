"""Typed job configuration, loaded from a YAML file in ``jobs/`` and overridable from the CLI.

A job file is validated completely before anything is built or started, and every
error names the file and the dotted key that is wrong::

    jobs/stsb.yaml: key 'bi_encoder.epochs' Input should be greater than 0

Strings may reference environment variables as ``${NAME}`` or ``${NAME:-default}``;
this is how job files find the data directory (``AUGSBERT_DATA_DIR``). The loaded config
remembers which variables each value came from, so that a path that does not resolve can
say why (``JobConfig.env_references``).

A key given twice in one mapping (two ``sampling:`` sections) is an error, not a silent
"the last one wins"; an unknown key is named with the closest valid key and every valid
key at its level.
"""

from __future__ import annotations

import collections
import difflib
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from augsbert_ray.errors import ConfigError
from augsbert_ray.models import EMBEDDED_MODEL
from augsbert_ray.sources import DataSource
from augsbert_ray.strict_model import StrictModel

# The sampling strategies (AugSBERT section 3.1); augsbert_ray.candidates.SAMPLERS implements
# exactly these (a test checks), so validating a job file needs no sampler code.
Strategy = Literal["bm25", "ss", "bm25+ss", "rs", "kde"]


def placement(default: Any, **kwargs) -> Any:
    """A setting that only places or sizes work (actors, CPUs, GPUs, batch sizes, workers,
    retries): it never changes a result, so changing it never redoes a finished stage."""
    return Field(default, json_schema_extra={"placement": True}, **kwargs)


def model_name(default: str = EMBEDDED_MODEL) -> Any:
    """A model setting: ``embedded``, a Hugging Face id or a local directory. A stage that
    reads it is fingerprinted by the model's content (``models.model_content_id``), not its name."""
    return Field(default, json_schema_extra={"model": True})


class _Strict(StrictModel):
    pass


class DataConfig(_Strict):
    train: DataSource
    # null: carve dev_fraction of the training pairs into a dev split (seeded with
    # subsample_seed), for datasets such as MRPC that ship without one.
    dev: DataSource | None
    test: DataSource
    dev_fraction: float = Field(0.1, gt=0, lt=1)
    # Keep a seeded random subset of a split's pairs, e.g. {train: 1000} for a low-resource
    # run (pairs keep their file order); splits not named are used whole.
    subsample: dict[Literal["train", "dev", "test"], PositiveInt] = {}
    subsample_seed: int = 42
    # "error": the first malformed row stops the job, naming file, line and field.
    # "skip": malformed rows are skipped and counted (with their reasons) in the run report.
    on_bad_rows: Literal["error", "skip"] = "error"


class CorpusConfig(_Strict):
    """An unlabelled target corpus: sentences from which candidate pairs are sampled."""

    path: str  # a file, a directory or a glob; local or a storage URI (s3://...)
    # lines: one sentence per line; tsv: tab-separated with a header row, quotes are text
    format: Literal["lines", "jsonl", "csv", "tsv", "parquet"] = "lines"
    column: str | None = None  # the text field (jsonl) or column (csv, tsv, parquet)
    max_chars: int = Field(1000, gt=0)  # longer lines are truncated or dropped (long_lines)
    long_lines: Literal["truncate", "drop"] = "truncate"
    on_bad_lines: Literal["error", "skip"] = "error"  # invalid UTF-8 or JSON: stop, or leave out (counted)
    max_sentences: int | None = Field(None, gt=1)  # a seeded sample of the distinct sentences; null: all

    @model_validator(mode="after")
    def _check(self) -> "CorpusConfig":
        if self.format != "lines" and not self.column:
            raise ValueError(f"column: format '{self.format}' needs the name of the text column")
        if self.format == "lines" and self.column:
            raise ValueError("column: format 'lines' has no columns (one sentence per line)")
        return self


class TargetConfig(_Strict):
    """Domain adaptation: the cross-encoder trained on the source gold (``data``) labels
    unlabelled target-domain pairs, and the bi-encoder trains on those silver pairs.

    The job's ``task`` is the source's (how the teacher and the bi-encoder are trained);
    ``target.task`` says how the target test is scored.
    """

    # Target pairs, labelled by the teacher as they are (the paper's setting). Their gold
    # labels, if the file has them, never reach AugSBERT; they train the upper bound only.
    pairs: DataSource | None = None
    # Or an unlabelled target corpus: the job's sampling strategy picks pairs of its sentences.
    corpus: CorpusConfig | None = None
    test: DataSource  # labelled target test set
    # Labelled target dev set: picks the F1 threshold of a binary target (without one, a
    # binary target reports AUC(0.05), which needs no threshold).
    dev: DataSource | None = None
    task: Literal["regression", "binary"] | None = None  # null: the job's task
    # Train AugSBERT on source gold + target silver (default: target silver only).
    mix_source_gold: bool = False
    # Train the upper-bound bi-encoder on the target pairs' own labels, when they have them.
    upper_bound: bool = True

    @model_validator(mode="after")
    def _check(self) -> "TargetConfig":
        if (self.pairs is None) == (self.corpus is None):
            raise ValueError("give either target.pairs (pairs labelled as they are) or target.corpus "
                             "(sentences to sample pairs from), not both and not neither")
        for name in ("test", "dev"):
            src = getattr(self, name)
            if src is not None and not src.labelled:
                raise ValueError(f"{name}: the target {name} set needs labels (columns.label)")
        return self


class CrossEncoderConfig(_Strict):
    """Step 1: the teacher. Sigmoid output in [0, 1], binary cross-entropy on gold labels."""

    model: str = model_name()  # "embedded", a Hugging Face id, or a local path
    epochs: int = Field(4, gt=0)
    lr: float = Field(2e-5, gt=0)
    batch_size: int = Field(16, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_length: int = Field(128, gt=8)


Objective = Literal["auto", "cosine", "cosent", "angle", "cosent-distill", "angle-distill", "softmax", "contrastive"]
# Objectives that rank pairs by their similarity scores: regression only.
REGRESSION_OBJECTIVES = ("cosent", "angle", "cosent-distill", "angle-distill")
OBJECTIVE_DOC = (
    "The student's loss. cosine: MSE between the cosine and the score (SBERT; auto's choice for "
    "regression). cosent / angle: the batch's pairs ranked by cosine (CoSENT, Su 2022) or by AnglE's "
    "angle in complex space (Li & Li 2023) as their scores rank them, scale 20. cosent-distill / "
    "angle-distill: score distillation, the gold pairs ranked as in cosent / angle and each silver "
    "pair's cosine fitted to the teacher's score (MSE); on gold alone the same as cosent / angle. "
    "softmax: a classifier over (u, v, |u-v|) (auto's choice for binary tasks); contrastive: "
    "contrastive loss on cosine distance. The ranking and distillation objectives are for regression.")


class BiEncoderConfig(_Strict):
    """Step 3: the student. Mean pooling, cosine-similarity loss on (gold + silver) scores."""

    model: str = model_name()
    epochs: int = Field(1, gt=0)
    lr: float = Field(2e-5, gt=0)
    batch_size: int = Field(16, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_length: int = Field(128, gt=8)
    # Keep only the first N transformer layers of the initial model (a smaller, faster
    # student); null keeps them all.
    num_layers: int | None = Field(None, gt=0)
    # auto: cosine for regression; softmax over (u, v, |u-v|) for binary tasks (SBERT).
    objective: Objective = Field("auto", description=OBJECTIVE_DOC)
    # Seed of the bi-encoders' initialisation and data order; null: the job's seed. A seed
    # sweep over this key reuses the cross-encoder and (except semantic search) the candidates.
    seed: int | None = None
    # How many times each gold pair appears in AugSBERT's training set (gold + silver; its
    # pilot's too). Silver pairs often outnumber gold 20 to 1; repeating the gold keeps the
    # labels the student can trust from being drowned out. Only AugSBERT reads it: a change
    # reuses the gold-only bi-encoder, the candidates and the silver labels.
    # benchmarks/results/student_recipe_stsb1k.md measures 1, 3, 5 and 10.
    gold_repeat: int = Field(1, gt=0)

    def resolved_objective(self, task: str) -> str:
        return resolved_objective(self.objective, task)


def resolved_objective(objective: str, task: str) -> str:
    """The bi-encoder's objective: ``objective`` unless auto, which is cosine for regression
    and softmax over (u, v, |u-v|) for binary tasks (SBERT)."""
    if objective != "auto":
        return objective
    return "softmax" if task == "binary" else "cosine"


class FaissConfig(_Strict):
    """The vector index of semantic-search sampling."""

    index: Literal["flat", "ivf", "hnsw"] = "flat"  # flat: exact inner product (cosine)
    ivf_nlist: int = Field(1024, gt=0)  # IVF cells (capped at sentences / 39, faiss's minimum)
    ivf_nprobe: int = Field(16, gt=0)  # IVF cells visited per query; higher = better recall
    hnsw_m: int = Field(32, gt=1)  # HNSW graph degree
    hnsw_ef_search: int = Field(128, gt=0)  # HNSW beam width; higher = better recall
    # Index shards, each held by its own Ray actor (rows split evenly; the shards' top-k lists
    # are merged exactly). 1: one index in the sampling process.
    shards: int = placement(1, gt=0)
    shard_cpus: float = placement(1, gt=0)  # CPUs per shard actor
    shard_gpus: float = placement(0, ge=0)  # GPUs per shard actor
    # Flat and IVF indexes move to a GPU where faiss-gpu is installed and the process sees one
    # (HNSW stays on CPU). false keeps them on CPU.
    use_gpu: bool = placement(True)


class KDEConfig(_Strict):
    """KDE selection (AugSBERT section 3): label a large random pool, keep to match gold's density."""

    pool_per_sentence: int = Field(10, gt=0)  # random pairs per sentence labelled before selection
    bandwidth: float | None = Field(None, gt=0)  # scipy gaussian_kde bw_method; null: Scott's rule


class SamplingConfig(_Strict):
    """Step 2.1: which unlabelled pairs the teacher labels (AugSBERT section 3)."""

    strategy: Strategy = "bm25"
    top_k: int = Field(3, gt=0)  # neighbours retrieved per sentence (bm25, ss)
    random_per_sentence: int = Field(3, gt=0)  # random partners per sentence (rs)
    query_batch_size: int = placement(256, gt=0)  # sentences per Ray Data batch of queries
    searchers: int = placement(1, gt=0)  # size of the query / embedding actor pool
    # Which bi-encoder embeds sentences for semantic search: the one trained on gold (as
    # in the paper) or the untrained model.
    ss_model: Literal["gold_only", "zero_shot"] = "gold_only"
    embed_batch_size: int = placement(128, gt=0)
    faiss: FaissConfig = FaissConfig()
    kde: KDEConfig = KDEConfig()


class LabelingConfig(_Strict):
    """Step 2.2: the cross-encoder scores candidates in a Ray Data actor pool."""

    # Actor pool size; null: one per num_gpus GPUs of the cluster when actors have GPUs, else 1.
    actors: int | None = placement(None, gt=0)
    num_gpus: float = placement(0, ge=0)  # GPUs per actor; 0 runs on CPU
    num_cpus: float | None = placement(None, gt=0)  # CPUs per actor; null: all local CPUs / actors
    # Pairs per shard: one Ray Data batch, committed on its own. 0: 1024 on CPU, 16384 when the
    # actors have GPUs (a GPU scores a small batch faster than Ray Data hands it over).
    block_size: int = placement(0, ge=0)
    micro_batch_size: int = placement(4096, gt=0)  # most pairs per forward pass (pairs are sorted by length)
    # Most padded tokens (pairs x longest pair) per forward pass; 0: 2048 on CPU, 65536 on a GPU.
    token_budget: int = placement(0, ge=0)
    # auto: bf16 on a GPU (fp16 where bf16 is missing); on CPU, bf16 where the CPU has bf16
    # matrix instructions (AVX-512 BF16 or AMX), else fp32. int8 (dynamic quantisation of the
    # linear layers, CPU) moved a trained teacher's scores by up to 0.29-0.42 (Spearman
    # 0.985-0.987 with fp32, 3,000 STSb pairs), so it is opt-in;
    # benchmarks/labeling_speed.py measures each against fp32.
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] = "auto"
    # Map the teacher's scores to the gold scale before the student trains on them: isotonic
    # regression of gold labels on the teacher's dev scores (a sigmoid teacher compresses the
    # scale: STSb silver labels averaged 0.41 against gold's 0.56). none: the scores as they are.
    calibration: Literal["none", "isotonic"] = "none"
    compile: bool = placement(False)  # torch.compile the cross-encoder (slow first batches; helps on long runs)
    # auto: tokenise in CPU tasks ahead of the actors when they run on GPUs, in the actors on CPU.
    tokenize_stage: Literal["auto", "actor", "separate"] = placement("auto")
    # A labelling actor that dies (node lost, OOM) is restarted up to max_restarts times and its
    # batch retried up to max_task_retries times (-1: without limit). If the pool still fails, a
    # new pool labels the shards not yet committed, up to pool_retries times; then the stage
    # fails, keeping the committed shards for a re-run.
    max_restarts: int = placement(4, ge=-1)
    max_task_retries: int = placement(4, ge=-1)
    pool_retries: int = placement(2, ge=0)

    @model_validator(mode="after")
    def _auto_block_size(self):
        if self.block_size == 0:
            self.block_size = 16384 if self.num_gpus > 0 else 1024
        return self


class TrainingConfig(_Strict):
    """Ray Train resources for both fine-tuning steps."""

    # Data-parallel workers. An encoder's batch_size is the global batch: each worker takes
    # batch_size / num_workers pairs a step, so more workers do not change the recipe.
    num_workers: int = placement(1, gt=0)
    use_gpu: bool = placement(False)
    cpus_per_worker: float | None = placement(None, gt=0)  # null: all local CPUs / workers
    # Checkpoint the full training state every this fraction of the steps (0: only at the
    # end). After a worker or node failure, training resumes from the latest checkpoint.
    checkpoint_every: float = placement(0.25, ge=0, le=1)
    max_failures: int = placement(2, ge=0)  # worker-group restarts before the stage fails
    # bf16: mixed precision (fp32 weights and optimizer, the forward pass autocast to bf16).
    # auto: bf16 on a GPU that has it and on CPUs with bf16 matrix instructions (AVX-512 BF16
    # or AMX), fp32 elsewhere. fp32 is the default: the results in benchmarks/ were trained in
    # it; benchmarks/training_precision.py measures bf16's speed and scores against it.
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    # Batches of pairs of similar lengths: the training pairs are cut into chunks of this many
    # batches, each sorted by length, and the batches shuffled (0: random batches). A batch is
    # padded to its longest pair, and random batches of STSb pairs carry 2.2 padded tokens per
    # real one; grouped by 50, 1.04 (see training.loop.length_grouped_batches).
    length_grouping: int = Field(50, ge=0)


class EvaluationConfig(_Strict):
    batch_size: int = placement(64, gt=0)
    # Before labelling, compare the cross-encoder with the gold-only bi-encoder on dev:
    # warn (default) or stop when the teacher is not better, since its labels then rarely help.
    teacher_check: Literal["warn", "stop"] = "warn"
    # After labelling, a pilot that predicts whether the silver labels help: the student trained
    # for pilot_fraction of its steps on gold alone and on gold + silver, both scored on dev
    # (two short Ray Tune trials). Off by default; the autopilot always runs pilots.
    pilot: bool = False
    pilot_fraction: float = Field(0.2, gt=0, le=1)
    # The pilots predict "helps" (or "does not help") only when this share of the paired
    # bootstrap's samples of the gain on dev lies above (or below) 0: a smaller lead is within
    # what dev's size can tell apart, and the pilot makes no prediction.
    pilot_confidence: float = Field(0.9, gt=0, lt=1)
    # 0: the pilots are scored on dev. k >= 2: on the gold training pairs instead, k-fold: each
    # fold's pilots train on the other folds' gold (and the silver pairs none of the fold's
    # sentences are in) and predict the fold, so every gold pair is scored once (k pilots per
    # arm instead of one). For a small dev set beside a larger training set (MRPC: 408 dev pairs,
    # 3,668 training pairs). The teacher saw every fold, so the silver pilots learn a little
    # of the held-out folds through its labels; no domain-adaptation job (it has no target gold).
    pilot_folds: int = Field(0, ge=0)
    # Which bi-encoder the job ships as models/bi-encoder: the better of AugSBERT and gold-only
    # by their dev score (better; the report says which, with both scores), or AugSBERT
    # whatever its score (augsbert).
    shipping: Literal["better", "augsbert"] = "better"


class AutoConfig(_Strict):
    """The autopilot: the teacher recipe, the sampling strategy, the amount of silver and the
    label calibration chosen on dev by short student pilots (AugSBERT's seed-search idea applied
    to the job's other choices), then the chosen setting trained to the end.

    Every candidate setting shares what it can with the others through the stages'
    fingerprints: one teacher per recipe, the candidates once per strategy and amount, the
    labels once per teacher and candidates.
    """

    enabled: bool = False
    # Wall time for trying settings (their teachers, labels and pilots); settings not tried by
    # then are reported as such. The final training of the chosen setting is not counted.
    budget_minutes: float = Field(60, gt=0)
    # (epochs, learning rate) of each cross-encoder recipe tried.
    teacher_recipes: list[tuple[PositiveInt, float]] = [(4, 2e-5), (8, 5e-5)]
    strategies: list[Strategy] = ["bm25", "bm25+ss"]
    top_k: list[PositiveInt] = [3, 10]  # neighbours per sentence tried (bm25, ss, bm25+ss)
    calibration: list[Literal["none", "isotonic"]] = ["none", "isotonic"]
    # How many times AugSBERT's training set counts each gold pair (bi_encoder.gold_repeat),
    # tried with every setting above; null: the job's own value only. Only the pilots differ:
    # the teachers, candidates and labels are shared, and the gold-only pilot is the same.
    gold_repeat: list[PositiveInt] | None = None
    # The student's objectives (bi_encoder.objective) tried with every setting above, innermost;
    # null: the job's own only. As with gold_repeat, only the pilots differ: the teachers,
    # candidates and labels are shared (semantic search embeds with the job's own gold-only
    # student), and the gold-only pilot trains with the job's own objective.
    objective: list[Objective] | None = Field(None, description="bi_encoder.objective values tried with every "
                                              "setting (pilots only); null: the job's own")
    pilot_fraction: float = Field(0.2, gt=0, le=1)  # of the student's training steps
    # The job's own setting (its teacher recipe, strategy, top_k, calibration) is tried first,
    # and another replaces it only when that one's pilot beats it on dev beyond what dev can
    # tell apart (the paired bootstrap at evaluation.pilot_confidence). false: the best pilot
    # wins, however small its lead, and the job's own setting is tried only if in the grid.
    keep_job_setting: bool = True

    @model_validator(mode="after")
    def _check(self) -> "AutoConfig":
        for name in ("teacher_recipes", "strategies", "top_k", "calibration"):
            if not getattr(self, name):
                raise ValueError(f"{name}: give at least one to try")
        if self.gold_repeat is not None and not self.gold_repeat:
            raise ValueError("gold_repeat: give at least one to try, or null for the job's own")
        if self.objective is not None and not self.objective:
            raise ValueError("objective: give at least one to try, or null for the job's own")
        for epochs, lr in self.teacher_recipes:
            if not lr > 0:
                raise ValueError(f"teacher_recipes: the learning rate of ({epochs}, {lr}) must be above 0")
        return self


class SeedSearchConfig(_Strict):
    """Seed optimisation (AugSBERT, after Dodge et al. 2020) as Ray Tune trials.

    Every seed trains to ``prune_at`` of its steps and is scored on dev; exactly the best
    ``keep`` resume from their checkpoints and train to the end; the best of those on dev
    is the model. See augsbert_ray/training/seed_search.py.
    """

    enabled: bool = False
    targets: list[Literal["bi_encoder", "cross_encoder"]] = ["bi_encoder"]  # which encoders are searched
    # A count N (the encoder's seed, seed + 1, ..., seed + N - 1) or the seeds themselves.
    seeds: PositiveInt | list[int] = 5
    keep: PositiveInt = 1  # seeds that continue past the pruning point
    prune_at: float = Field(0.2, gt=0, le=1)  # fraction of the training steps at which seeds are scored
    # exact: the paper's semantics (all seeds scored, then exactly `keep` continue).
    # asha: Ray Tune's asynchronous ASHA; cheaper to schedule, but the number that survive varies.
    scheduler: Literal["exact", "asha"] = "exact"
    audit: bool = False  # also train the pruned seeds to the end and report how well the early ranking held
    cpus_per_trial: float | None = placement(None, gt=0)  # null: the cluster's CPUs / seeds, at least 1
    gpus_per_trial: float | None = placement(None, ge=0)  # null: 1 when training.use_gpu, else 0

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


class RayConfig(_Strict):
    # null: connect to RAY_ADDRESS if set, else start a local Ray inside the process.
    address: str | None = placement(None)
    num_cpus: int | None = placement(None, gt=0)  # for a local Ray only; null: all cores


@dataclass(frozen=True)
class EnvReference:
    """A ``${NAME}`` or ``${NAME:-default}`` that a value of the job file was built from.

    Attributes:
        name: the environment variable.
        default: the default written in the job file, or None.
        value: the variable's value when the job was loaded; None when it was not set (and
            the default was used).
    """

    name: str
    default: str | None
    value: str | None


# A job's name becomes its run directory (runs/<name>/) and names its Ray runs: it must be
# one ordinary path component. "." and ".." would be the current or the parent directory,
# and a leading dot a hidden one.
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NAME_MAX = 255  # bytes in one path component (NAME_MAX of Linux and macOS file systems)


class JobConfig(_Strict):
    """One AugSBERT job. See ``jobs/*.yaml`` for commented examples."""

    # The job's name and where it runs say where results go, not what they are.
    name: str = Field(json_schema_extra={"placement": True})
    task: Literal["regression", "binary"] = "regression"
    seed: int = 42
    run_dir: str = placement("runs/${name}")  # ${name} is replaced by the job's name
    data: DataConfig
    cross_encoder: CrossEncoderConfig = CrossEncoderConfig()
    sampling: SamplingConfig = SamplingConfig()
    labeling: LabelingConfig = LabelingConfig()
    bi_encoder: BiEncoderConfig = BiEncoderConfig()
    training: TrainingConfig = TrainingConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    seed_search: SeedSearchConfig = SeedSearchConfig()
    auto: AutoConfig = AutoConfig()
    ray: RayConfig = RayConfig()
    # Domain adaptation (null: in-domain AugSBERT, silver pairs sampled from the gold sentences).
    target: TargetConfig | None = None
    # Run Python code shipped with a model repository (custom architectures). Off by default:
    # turn it on only for models whose code you trust; the job warns when it is on.
    # (A permission, not a result: a model either needs its code or it does not.)
    trust_remote_code: bool = placement(False)

    # Where the config came from, for messages: the job file, and the environment variables
    # each dotted key's value was built from (set by load_job).
    _source: str | None = PrivateAttr(None)
    _env_refs: dict = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _JOB_NAME.fullmatch(name):
            raise ValueError(
                f"{name!r} cannot name a job: the name is the run directory runs/<name>/, so it must start "
                "with a letter or a digit and hold only letters, digits, '_', '.' and '-' "
                "('.' or '..' would be the current or the parent directory)"
            )
        if len(name.encode()) > _NAME_MAX:
            raise ValueError(f"a name of {len(name.encode())} bytes is too long: it names the run directory "
                             f"runs/<name>/, and a directory name holds at most {_NAME_MAX} bytes")
        return name

    @field_validator("run_dir")
    @classmethod
    def _check_run_dir(cls, run_dir: str) -> str:
        if not run_dir.strip():
            # An empty path would be the current directory, which the run would fill with its folders.
            raise ValueError("is empty; give the directory the job writes to (by default runs/${name}, "
                             "or '.' if the current directory is meant)")
        return run_dir

    def __eq__(self, other: object) -> bool:
        # Two configs are equal when they configure the same job: where each was loaded
        # from (the private provenance above) is not part of the job.
        if not isinstance(other, JobConfig):
            return NotImplemented
        return self.__dict__ == other.__dict__

    @property
    def source(self) -> str | None:
        """The job file this config was loaded from (None when built in code)."""
        return self._source

    def env_references(self, key: str) -> list[EnvReference]:
        """The environment variables the value of dotted ``key`` was built from, in order."""
        return list(self._env_refs.get(key, ()))

    @model_validator(mode="after")
    def _check_pilot_folds(self) -> "JobConfig":
        k = self.evaluation.pilot_folds
        if k == 1:
            raise ValueError("evaluation.pilot_folds: 1 fold would hold out every gold pair; give 0 (score the "
                             "pilots on dev) or at least 2")
        if k and not self.evaluation.pilot:
            raise ValueError(f"evaluation.pilot_folds: {k} folds score the pilots of evaluation.pilot, which is off "
                             "(the autopilot scores its own pilots on dev): set evaluation.pilot: true, or drop "
                             "pilot_folds")
        if k and self.target is not None:
            raise ValueError("evaluation.pilot_folds: a domain-adaptation job's pilots are scored on dev; folds of "
                             "the source gold would predict the source domain, not the target")
        return self

    @model_validator(mode="after")
    def _check_objective(self) -> "JobConfig":
        tasks = {"task": self.task}
        if self.target is not None and self.target.task:
            tasks["target.task"] = self.target.task
        for key, task in tasks.items():
            if task == "binary" and self.bi_encoder.objective in REGRESSION_OBJECTIVES:
                raise ValueError(f"bi_encoder.objective: {self.bi_encoder.objective} ranks pairs by their similarity "
                                 f"scores, and {key} is binary (labels 0/1); use softmax, contrastive or auto")
            searched = [o for o in self.auto.objective or [] if o in REGRESSION_OBJECTIVES]
            if task == "binary" and searched:
                raise ValueError(f"auto.objective: {', '.join(searched)} rank pairs by their similarity scores, and "
                                 f"{key} is binary (labels 0/1); try softmax, contrastive or auto")
        return self

    @model_validator(mode="after")
    def _check_labels(self) -> "JobConfig":
        for split in ("train", "dev", "test"):
            src = getattr(self.data, split)
            if src is not None and not src.labelled:
                raise ValueError(f"data.{split}: gold pairs need labels (columns.label)")
        return self

    @property
    def target_task(self) -> str:
        """How the target test is scored (domain adaptation); the job's task otherwise."""
        return (self.target.task if self.target is not None else None) or self.task

    @property
    def resolved_run_dir(self) -> Path | str:
        """The run directory: a local Path (``~`` expanded), or a storage URI (``s3://...``) kept
        as a string."""
        from augsbert_ray.rundir import is_uri

        location = self.run_dir.replace("${name}", self.name)
        return location if is_uri(location) else Path(location).expanduser()


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: Any, path: str | None, key: str = "", refs: dict | None = None) -> Any:
    """Replaces ``${VAR}`` / ``${VAR:-default}`` in every string of a parsed YAML tree.

    Args:
        refs: if given, filled with the ``EnvReference``s of each dotted key.
    """
    if isinstance(value, dict):
        return {k: _expand_env(v, path, f"{key}.{k}" if key else str(k), refs) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, path, f"{key}[{i}]", refs) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name == "name":  # left for the job's own name (see run_dir)
            return m.group(0)
        if refs is not None:
            refs.setdefault(key, []).append(EnvReference(name, default, os.environ.get(name)))
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(path, key, f"environment variable {name} is not set and has no default")

    return _ENV.sub(sub, value)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_duplicate_keys(root: yaml.Node | None, path: str | None) -> None:
    """Raises on a key given twice in one mapping, which PyYAML would silently resolve to the last.

    Walks the composed node graph (not the built tree, where the first value is already
    gone). Aliases can make the graph cyclic (``&a [*a]``), so each node is visited once.
    Merge keys (``<<: *base``) may be overridden by explicit keys, as YAML intends.

    Raises:
        ConfigError: naming the dotted key and both lines.
    """
    queue, seen = collections.deque([(root, "")]), set()
    while queue:
        node, key = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for k, v in node.value:
                if not isinstance(k, yaml.ScalarNode) or k.tag == _MERGE_TAG:
                    queue.append((v, key))
                    continue
                dotted = f"{key}.{k.value}" if key else k.value
                line = k.start_mark.line + 1
                if (k.tag, k.value) in first:
                    raise ConfigError(path, dotted, f"given twice in one mapping (lines {first[(k.tag, k.value)]} "
                                                    f"and {line}); YAML would silently keep only the last: "
                                                    "merge the two into one")
                first[(k.tag, k.value)] = line
                queue.append((v, dotted))
        elif isinstance(node, yaml.SequenceNode):
            queue.extend((v, f"{key}[{i}]") for i, v in enumerate(node.value))


# PyYAML lets some malformed input escape as plain Python errors: an impossible date
# (2020-13-45) or a bad value under an explicit tag (!!int x, !!bool maybe, !!timestamp x)
# raises ValueError, KeyError or AttributeError, and very deep nesting RecursionError.
_YAML_ERRORS = (yaml.YAMLError, ValueError, LookupError, AttributeError, RecursionError)


def _yaml_problem(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark else ""
    return f"invalid YAML{where}: {getattr(e, 'problem', None) or e}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parses ``key.sub=value`` into (["key", "sub"], value), the value read as YAML.

    Raises:
        ConfigError: if the text has no ``=``, an empty key, or a value that is not YAML.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(None, text, "an override must look like key.sub=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except _YAML_ERRORS as e:
        raise ConfigError(None, key.strip(), _yaml_problem(e)) from e
    return key.strip().split("."), value


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    """Sets each ``key.sub=value`` in a parsed YAML tree, creating mappings as needed."""
    for text in overrides:
        keys, value = parse_override(text)
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(None, ".".join(keys), f"'{k}' is not a mapping")
        node[keys[-1]] = value
    return tree


def load_job(path: str | os.PathLike, overrides: list[str] | None = None) -> JobConfig:
    """Loads, expands and validates a job file.

    Args:
        path: the YAML job file.
        overrides: ``key.sub=value`` strings applied on top of the file.

    Returns:
        The validated job config.

    Raises:
        ConfigError: on unreadable YAML, unknown or invalid keys; the message names the
            file and the dotted key.
    """
    path = str(path)
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise ConfigError(path, None, f"cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(path, None, f"not UTF-8 text: {e.reason} at byte {e.start}") from e
    try:
        _refuse_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), path)
        tree = yaml.safe_load(text)
    except _YAML_ERRORS as e:
        raise ConfigError(path, None, _yaml_problem(e)) from e
    if not isinstance(tree, dict):
        raise ConfigError(path, None, "a job file must be a YAML mapping")
    try:
        tree = apply_overrides(tree, overrides or [])
    except ConfigError as e:
        raise ConfigError(path, e.key, e.reason) from e
    refs: dict[str, list[EnvReference]] = {}
    try:
        tree = _expand_env(tree, path, refs=refs)
    except RecursionError:  # a YAML alias inside itself (&a [*a]) makes an endless tree
        raise ConfigError(path, None, "a value contains itself (a recursive YAML alias?)") from None
    cfg = validate_tree(tree, path)
    cfg._source, cfg._env_refs = path, refs
    return cfg


def validate_tree(tree: dict, path: str | None = None) -> JobConfig:
    """Validates a parsed config tree, turning pydantic's errors into a ConfigError.

    Raises:
        ConfigError: naming ``path`` and the dotted key of the first problem; an unknown key
            comes with the closest valid key (if one is close) and every valid key at its level.
    """
    try:
        return JobConfig.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or None
        more = f" (and {e.error_count() - 1} more errors)" if e.error_count() > 1 else ""
        # pydantic prefixes the message of a validator's ValueError with "Value error, ".
        reason = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            reason = unknown_key_reason(err["loc"])
        elif err["type"] in ("literal_error", "enum"):
            reason += f", not {err['input']!r}"
        raise ConfigError(path, key, f"{reason}{more}") from e


def unknown_key_reason(loc: tuple) -> str:
    """Why ``loc`` is refused: the closest valid key, if one is close, and every valid key at its level.

    Example: ``unknown key; did you mean 'epochs'? (valid keys under bi_encoder: batch_size, ...)``.

    The valid keys are the fields of the config model at ``loc[:-1]``; where that level is
    not a model (a mapping of free keys), only "unknown key" is said.
    """
    model: Any = JobConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return "unknown key"
    valid = sorted(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    level = f" under {'.'.join(str(p) for p in loc[:-1])}" if len(loc) > 1 else ""
    return f"unknown key{hint} (valid keys{level}: {', '.join(valid)})"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model an annotation holds (``X``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if (model := _model_in(arg)) is not None:
                return model
    return None


def dump_job(cfg: JobConfig) -> str:
    """The resolved config as YAML, written into every run directory."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
