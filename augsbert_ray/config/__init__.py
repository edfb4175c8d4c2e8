"""Typed job configuration, loaded from a YAML file in ``jobs/`` and overridable from the CLI.

A job file is validated completely before anything is built or started, and every
error names the file and the dotted key that is wrong::

    jobs/stsb.yaml: key 'bi_encoder.epochs' Input should be greater than 0

Strings may reference environment variables as ``${NAME}`` or ``${NAME:-default}``;
this is how job files find the data directory (``AUGSBERT_DATA_DIR``). The loaded config
remembers which variables each value came from, so that a path that does not resolve can
say why (``JobConfig.env_references``).

Modules: ``fields`` (the section base, placement and model fields), one module per group of
sections (``data``, ``encoders``, ``sampling``, ``labeling``, ``training``, ``evaluation``),
``job`` (``JobConfig``), ``env`` (``${VAR}`` expansion), ``loading`` (YAML, overrides,
validation, dump), ``explain`` (``augsbert validate --explain``) and ``reference`` (``jobs/CONFIG.md``). Every field carries its
documentation as ``Field(description=...)``.
"""

from augsbert_ray.config.data import CorpusConfig, DataConfig, TargetConfig
from augsbert_ray.config.encoders import (OBJECTIVE_DOC, REGRESSION_OBJECTIVES, BiEncoderConfig, CrossEncoderConfig,
                                          Objective, resolved_objective)
from augsbert_ray.config.env import EnvReference
from augsbert_ray.config.evaluation import AutoConfig, EvaluationConfig
from augsbert_ray.config.explain import explain
from augsbert_ray.config.fields import Section, model_name, placement
from augsbert_ray.config.job import JobConfig, RayConfig
from augsbert_ray.config.labeling import LabelingConfig
from augsbert_ray.config.loading import (apply_overrides, dump_job, load_job, parse_override, unknown_key_reason,
                                         validate_tree)
from augsbert_ray.config.sampling import FaissConfig, KDEConfig, SamplingConfig, Strategy
from augsbert_ray.config.training import SeedSearchConfig, TrainingConfig
from augsbert_ray.errors import ConfigError
from augsbert_ray.models import EMBEDDED_MODEL

__all__ = [
    "AutoConfig", "BiEncoderConfig", "ConfigError", "CorpusConfig", "CrossEncoderConfig", "DataConfig",
    "EMBEDDED_MODEL", "EnvReference", "EvaluationConfig", "FaissConfig", "JobConfig", "KDEConfig", "LabelingConfig",
    "OBJECTIVE_DOC", "Objective", "REGRESSION_OBJECTIVES", "RayConfig", "SamplingConfig", "Section",
    "SeedSearchConfig", "Strategy", "TargetConfig", "TrainingConfig", "apply_overrides", "dump_job", "explain",
    "load_job", "model_name", "parse_override", "placement", "resolved_objective", "unknown_key_reason",
    "validate_tree",
]
