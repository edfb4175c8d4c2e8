"""One AugSBERT job: its sections composed, and the checks that span sections."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from augsbert_ray.config.data import DataConfig, TargetConfig
from augsbert_ray.config.encoders import REGRESSION_OBJECTIVES, BiEncoderConfig, CrossEncoderConfig
from augsbert_ray.config.env import EnvReference
from augsbert_ray.config.evaluation import AutoConfig, EvaluationConfig
from augsbert_ray.config.fields import Seed, Section, placement
from augsbert_ray.config.labeling import LabelingConfig
from augsbert_ray.config.sampling import SamplingConfig
from augsbert_ray.config.tracking import TrackingConfig
from augsbert_ray.config.training import SeedSearchConfig, TrainingConfig


class RayConfig(Section):
    """The Ray cluster the job runs on."""

    address: str | None = placement(None, description="a cluster address; null: connect to RAY_ADDRESS if set, "
                                                      "else start a local Ray inside the process")
    num_cpus: int | None = placement(None, gt=0, description="CPUs of a local Ray only; null: all cores")


# A job's name becomes its run directory (runs/<name>/) and names its Ray runs: it must be
# one ordinary path component. "." and ".." would be the current or the parent directory,
# and a leading dot a hidden one.
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NAME_MAX = 255  # bytes in one path component (NAME_MAX of Linux and macOS file systems)


class JobConfig(Section):
    """One AugSBERT job. See ``jobs/*.yaml`` for commented examples."""

    # The job's name and where it runs say where results go, not what they are: placement.
    name: str = Field(json_schema_extra={"placement": True},
                      description="the job's name: its run directory and the name of its Ray runs")
    task: Literal["regression", "binary"] = Field("regression", description="regression: similarity scores in "
                                                                            "[0, 1]; binary: labels 0/1")
    seed: Seed = Field(42, description="seed of the encoders' initialisation, data order and sampling")
    run_dir: str = placement("runs/${name}", description="where the run writes; ${name} is replaced by the job's "
                                                         "name; local or a storage URI (s3://...)")
    data: DataConfig = Field(description="the gold pairs")
    cross_encoder: CrossEncoderConfig = Field(CrossEncoderConfig(), description="the teacher")
    sampling: SamplingConfig = Field(SamplingConfig(), description="which pairs the teacher labels")
    labeling: LabelingConfig = Field(LabelingConfig(), description="the teacher's labelling actor pool")
    bi_encoder: BiEncoderConfig = Field(BiEncoderConfig(), description="the student")
    training: TrainingConfig = Field(TrainingConfig(), description="Ray Train resources of both encoders")
    evaluation: EvaluationConfig = Field(EvaluationConfig(), description="scoring, pilots and shipping")
    seed_search: SeedSearchConfig = Field(SeedSearchConfig(), description="seed optimisation")
    auto: AutoConfig = Field(AutoConfig(), description="the autopilot")
    ray: RayConfig = Field(RayConfig(), description="the Ray cluster")
    tracking: TrackingConfig = Field(TrackingConfig(), description="experiment tracking (MLflow, TensorBoard)")
    target: TargetConfig | None = Field(None, description="domain adaptation; null: in-domain AugSBERT, silver "
                                                          "pairs sampled from the gold sentences")
    # A permission, not a result (a model either needs its code or it does not): placement.
    trust_remote_code: bool = placement(
        False, description="run Python code shipped with a model repository (custom architectures); turn it on "
                           "only for models whose code you trust (the job warns when it is on)")

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
        # Where each config was loaded from (the private provenance above) is not part of the job.
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
    def _check_curriculum(self) -> "JobConfig":
        if (self.bi_encoder.curriculum == "silver-first" and self.seed_search.enabled
                and "bi_encoder" in self.seed_search.targets):
            raise ValueError("bi_encoder.curriculum: silver-first trains the student twice (silver, then gold), and "
                             "the seed search scores one training's seeds: use curriculum mixed, or leave bi_encoder "
                             "out of seed_search.targets")
        return self

    @model_validator(mode="after")
    def _check_given_teacher(self) -> "JobConfig":
        if self.cross_encoder.train:
            return self
        if self.seed_search.enabled and "cross_encoder" in self.seed_search.targets:
            raise ValueError("cross_encoder.train: false uses the teacher as given, so the seed search has no "
                             "teacher training to seed: leave cross_encoder out of seed_search.targets")
        if self.auto.enabled and len(self.auto.teacher_recipes) > 1:
            raise ValueError("cross_encoder.train: false uses the teacher as given, so the autopilot has no teacher "
                             "recipe to choose: give auto.teacher_recipes one recipe (it is not used)")
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
