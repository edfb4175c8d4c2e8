"""A run's results as one typed record: written as ``metrics.json``, read by the report,
``augsbert report`` and the benchmarks.

Each stage's record holds its typed result (``stages.base.StageResult``); ``metrics.json``
also carries flat views of them for programs (``scores``, ``data``, ``sampling``, ...,
each result's ``view``). Scores are ``scores[model][split][metric]`` with models ``zero_shot``, ``gold_only``,
``cross_encoder``, ``target_gold`` (domain adaptation's upper bound) and ``augsbert``, splits
``dev``, ``test`` (and ``target_test``, ``target_dev``), and metrics as
``augsbert_ray.evaluation`` computes them (``spearman``; ``f1``, ``accuracy``, ``auc_0.05``).

Example:
    >>> m = RunMetrics.load("runs/stsb-bm25/metrics.json")  # doctest: +SKIP
    >>> m.score("augsbert", "test") - m.score("gold_only", "test")  # doctest: +SKIP
    -0.99
    >>> m.result("ship").shipped  # doctest: +SKIP
    'gold_only'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializeAsAny, ValidationError, field_validator

from augsbert_ray.errors import DataError
from augsbert_ray.stages.base import StageResult

MODELS = ("zero_shot", "gold_only", "cross_encoder", "target_gold", "augsbert")


def _result(stage: str, data: Any):
    """A stored result as its stage's type (``stages.result_type_of``); kept as it is
    (``stages.base.Recorded``) where it is of another version or an unknown stage."""
    from augsbert_ray.stages import result_type_of
    from augsbert_ray.stages.base import Recorded

    if isinstance(data, StageResult):
        return data
    kind = result_type_of(stage)
    if kind is not None:
        try:
            return kind.model_validate(data, context={"stage": stage})
        except ValidationError:
            pass
    try:
        return Recorded.model_validate(data if isinstance(data, dict) else {})
    except ValidationError:  # keys pydantic cannot hold as fields: nothing of it is shown anyway
        return Recorded()


class StageRecord(BaseModel):
    """One stage of a run: what it is, how long it took, whether an earlier run did it, and its
    typed result (``stages.base.StageResult``)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    name: str
    kind: str  # "load", "train", "evaluate", "check", "candidates", "label"
    fingerprint: str
    seconds: float
    reused: bool
    throughput: str = ""  # e.g. "27.1 training pairs/s (in the training loop, fp32)"
    # The part of ``seconds`` that does not grow with the stage's work (starting workers,
    # loading models, checkpoints), where the stage measures it.
    fixed_seconds: float | None = None
    # Of ``fixed_seconds``: starting the job's warm host, paid by the first stage it served.
    host_start_seconds: float | None = None
    result: SerializeAsAny[StageResult]

    @field_validator("result", mode="before")
    @classmethod
    def _typed(cls, value, info):
        return _result(info.data.get("name", ""), value)

    def to_dict(self) -> dict:
        return {**self.model_dump(mode="json", exclude={"result"}), "result": self.result.record()}


class ClusterInfo(BaseModel):
    """The Ray cluster a run used (``runtime.ClusterResources``)."""

    cpus: float
    gpus: float
    nodes: int = 1
    memory_gb: float = 0.0
    object_store_gb: float = 0.0
    logs: str | None = None
    dashboard: str | None = None


class RunMetrics(BaseModel):
    """Everything a finished (or partly finished) run measured: the job, its stages with
    their typed results, and where it ran."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    job: str
    task: str
    primary_metric: str
    run_dir: str
    bi_encoder_objective: str = ""
    stages: list[StageRecord] = []
    cluster: ClusterInfo | None = None
    versions: dict[str, str] = {}
    complete: bool = True  # False for a run stopped before its last stage
    stages_planned: list[str] = []  # every stage of the job, in order
    tracking: dict[str, str] = {}  # where the job's tracking run went (tracking.tracking_info); {}: none

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

    @property
    def scores(self) -> dict[str, dict[str, dict[str, Any]]]:
        """model -> split -> metric -> value, for every model scored so far."""
        out = {}
        for s in self.stages:
            out.update(s.result.model_scores())
        return out

    @property
    def baselines(self) -> dict[str, dict[str, dict[str, Any]]]:
        """baseline (jaccard, majority) -> split -> metric -> value."""
        out: dict = {}
        for s in self.stages:
            for name, splits in s.result.baseline_scores().items():
                out.setdefault(name, {}).update(splits)
        return out

    def stage(self, name: str) -> StageRecord:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage '{name}' in this run; stages: {', '.join(s.name for s in self.stages)}")

    def result(self, name: str):
        """The typed result of stage ``name`` (None if it has not run)."""
        return next((s.result for s in self.stages if s.name == name), None)

    def score(self, model: str, split: str = "test", metric: str | None = None) -> float:
        """A model's score on a split (default: the task's primary metric)."""
        return self.scores[model][split][metric or self.primary_metric]

    def views(self) -> dict[str, dict]:
        """The stages' results as the flat views of ``metrics.json`` (``scores``, ``data``,
        ``sampling``...): each result's ``view``, merged key by key."""
        out: dict[str, dict] = {}
        for s in self.stages:
            for key, value in s.result.view(s.name).items():
                out[key] = _merged(out.get(key, {}), value)
        return out

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = self.model_dump(mode="json", exclude={"stages"})
        out["stages"] = [s.to_dict() for s in self.stages]
        # Flat views kept for programs that read metrics.json (one number per stage, the scores...).
        out.update({"scores": {}, "baselines": {}, "data": {}, "sampling": {}, "seed_search": {}} | self.views())
        out["baselines"] = self.baselines
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
        try:
            return cls.model_validate({k: v for k, v in data.items() if k in cls.model_fields})
        except ValidationError as e:
            err = e.errors()[0]
            raise DataError(source, None, ".".join(str(p) for p in err["loc"]),
                            f"{err['msg']}; the file is damaged or not a run's metrics: " + AGAIN) from None

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


def _merged(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


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
