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

from augsbert_ray.errors import DataError

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
    stages_planned: list[str] = field(default_factory=list)  # every stage of the job, in order

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
    def from_dict(cls, data: dict, source: str = "<metrics>") -> "RunMetrics":
        """A run's metrics from their JSON form.

        Raises:
            DataError: naming ``source`` and the first field that is missing or of the wrong type.
        """
        check_fields(data, source)
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        stage_fields = {f.name for f in fields(StageRecord)}
        kwargs["stages"] = [StageRecord(**{k: v for k, v in s.items() if k in stage_fields})
                            for s in data.get("stages", [])]
        return cls(**kwargs)

    @classmethod
    def load(cls, path: str | Path) -> "RunMetrics":
        """Reads a run's ``metrics.json`` (a path to the file or to the run directory).

        Raises:
            DataError: naming the file and what is wrong with it (not a file, empty, not
                UTF-8, not JSON, not an object, a field missing or of the wrong type).
        """
        path = Path(path)
        if path.is_dir() and not path.name == "metrics.json":
            path = path / "metrics.json"
        return cls.from_dict(read_json_object(path), str(path))


AGAIN = "rerun the job to write it again (finished stages are reused)"


def read_json_object(path: Path) -> dict:
    """A JSON object from a file the job wrote, or a ``DataError`` saying what is wrong with the file."""
    if path.is_dir():
        raise DataError(str(path), None, None, "a folder, not the file a job writes: remove it and " + AGAIN)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(str(path), None, None, f"cannot be read: {e.strerror}") from None
    if not raw.strip():
        raise DataError(str(path), None, None, f"empty ({len(raw)} bytes): " + AGAIN)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(str(path), None, None, f"not UTF-8 text (byte {e.start}): the file is damaged; " + AGAIN) from None
    except ValueError as e:
        line, column = getattr(e, "lineno", None), getattr(e, "colno", None)
        where = f" at column {column}" if column else ""
        raise DataError(str(path), line, None, f"not valid JSON{where} ({getattr(e, 'msg', e)}): the file is "
                                               "truncated or damaged; " + AGAIN) from None
    if not isinstance(data, dict):
        raise DataError(str(path), None, None, f"holds a JSON {type(data).__name__}, not the object of a run's "
                                               "metrics; " + AGAIN)
    return data


_NUMBER = (int, float)
# Fields the summary reads: name -> (accepted types, required).
_FIELDS = {"job": (str, True), "task": (str, True), "primary_metric": (str, True), "run_dir": (str, True),
           "scores": (dict, False), "baselines": (dict, False), "data": (dict, True), "sampling": (dict, False),
           "seed_search": (dict, False), "stages": (list, False), "versions": (dict, False), "complete": (bool, False),
           "stages_planned": (list, False)}
_STAGE_FIELDS = {"name": str, "kind": str, "fingerprint": str, "seconds": _NUMBER, "reused": bool}


def check_fields(data: dict, source: str) -> None:
    """The fields of a run's metrics that the summary reads are there, with the right types.

    Raises:
        DataError: naming ``source`` and the field.
    """
    def wrong(name: str, what: str):
        return DataError(source, None, name, f"{what}; the file is damaged or not a run's metrics: " + AGAIN)

    for name, (kind, required) in _FIELDS.items():
        if name not in data:
            if required:
                raise wrong(name, "missing")
            continue
        if not isinstance(data[name], kind) or (kind is not bool and isinstance(data[name], bool)):
            raise wrong(name, f"is {json.dumps(data[name])[:40]}, not a JSON {_JSON_NAMES[kind]}")
    metric = data["primary_metric"]
    for model, splits in data.get("scores", {}).items():
        for split, values in (splits.items() if isinstance(splits, dict) else [("", splits)]):
            score = values.get(metric) if isinstance(values, dict) else None
            if not isinstance(score, _NUMBER) or isinstance(score, bool):
                raise wrong(f"scores.{model}.{split}.{metric}".rstrip("."), "missing or not a number")
    for i, stage in enumerate(data.get("stages", [])):
        for name, kind in _STAGE_FIELDS.items():
            value = stage.get(name) if isinstance(stage, dict) else None
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                raise wrong(f"stages[{i}].{name}", "missing or of the wrong type")
    for name in ("train", "dev", "test"):
        if not isinstance(data["data"].get(name), int) or isinstance(data["data"].get(name), bool):
            raise wrong(f"data.{name}", "missing or not a count of pairs")


_JSON_NAMES = {str: "string", dict: "object", list: "list", bool: "boolean"}
