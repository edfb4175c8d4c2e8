"""A run's results as one typed record: written as ``metrics.json``, read by the report,
``augsbert report`` and the benchmarks.

Scores are ``scores[model][split][metric]`` with models ``zero_shot``, ``gold_only``,
``cross_encoder``, ``target_gold`` (domain adaptation's upper bound) and ``augsbert``, splits
``dev``, ``test`` (and ``target_test``, ``target_dev``), and metrics as
``augsbert_ray.evaluation`` computes them (``spearman``; ``f1``, ``accuracy``, ``auc_0.05``).

Example:
    >>> m = RunMetrics.load("runs/stsb-bm25/metrics.json")  # doctest: +SKIP
    >>> m.score("augsbert", "test") - m.score("gold_only", "test")  # doctest: +SKIP
    -0.99
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

MODELS = ("zero_shot", "gold_only", "cross_encoder", "target_gold", "augsbert")


@dataclass
class StageRecord:
    """One stage of a run: what it is, how long it took, and whether an earlier run did it."""

    name: str
    kind: str  # "load", "train", "evaluate", "check", "candidates", "label"
    fingerprint: str
    seconds: float
    reused: bool
    throughput: str = ""  # e.g. "27.1 training pairs/s (in the training loop, fp32)"
    # The part of ``seconds`` that does not grow with the stage's work (starting workers,
    # loading models, checkpoints), where the stage measures it.
    fixed_seconds: float | None = None
    result: dict = field(default_factory=dict)


@dataclass
class RunMetrics:
    """Everything a finished (or partly finished) run measured."""

    job: str
    task: str
    primary_metric: str
    run_dir: str
    scores: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    baselines: dict[str, dict] = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    bi_encoder_objective: str = ""
    target: dict | None = None
    sampling: dict = field(default_factory=dict)
    teacher_check: dict | None = None
    seed_search: dict[str, dict] = field(default_factory=dict)
    calibration: dict | None = None  # the silver labels' map to the gold scale, before and after
    pilot: dict | None = None  # the predicting teacher check: pilots' dev scores
    auto: dict | None = None  # the autopilot: every setting tried, its pilot and fate
    shipped: dict | None = None  # which bi-encoder models/bi-encoder is, and why
    stages: list[StageRecord] = field(default_factory=list)
    cluster: dict | None = None
    versions: dict = field(default_factory=dict)
    complete: bool = True  # False for a run stopped before its last stage

    # -- derived views ----------------------------------------------------------------------
    @property
    def stage_seconds(self) -> dict[str, float]:
        return {s.name: s.seconds for s in self.stages}

    @property
    def stages_reused(self) -> list[str]:
        return [s.name for s in self.stages if s.reused]

    @property
    def stage_throughput(self) -> dict[str, str]:
        return {s.name: s.throughput for s in self.stages if s.throughput}

    def stage(self, name: str) -> StageRecord:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage '{name}' in this run; stages: {', '.join(s.name for s in self.stages)}")

    def score(self, model: str, split: str = "test", metric: str | None = None) -> float:
        """A model's score on a split (default: the task's primary metric)."""
        return self.scores[model][split][metric or self.primary_metric]

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = asdict(self)
        # Flat views kept for readers of metrics.json that want one number per stage.
        out["stage_seconds"] = self.stage_seconds
        out["stages_reused"] = self.stages_reused
        out["stage_throughput"] = self.stage_throughput
        return out

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, default=str), encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict) -> "RunMetrics":
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["stages"] = [StageRecord(**s) for s in data.get("stages", [])]
        return cls(**kwargs)

    @classmethod
    def load(cls, path: str | Path) -> "RunMetrics":
        """Reads a run's ``metrics.json`` (a path to the file or to the run directory)."""
        path = Path(path)
        if path.is_dir():
            path = path / "metrics.json"
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
