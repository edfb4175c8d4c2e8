"""What a stage is: its params, the artifacts it takes and writes, ``run`` and its result.

A stage declares everything its result depends on (``Declaration``): one frozen, typed
params object built from the job config (``StageParams``: the settings ``run`` uses, and
nothing else of the config reaches ``run``), its inputs (artifacts of earlier stages, by
id) and the artifacts it writes. The runner (``augsbert_ray.runner``) derives the stage's
fingerprint from exactly that: the params' dump (``fingerprint_settings``), in which
settings marked ``placement`` (actors, CPUs, GPUs, batch sizes, workers) are left out and
model settings count by the model's content, and the inputs' fingerprints. A stage is
redone when, and only when, something it declared changed.

``run`` returns a typed result (``StageResult``), stored in the stage's marker and in the
run's ``metrics.json``; the result renders the stage's own part of ``summary.md``.

Example:
    >>> class CountParams(StageParams):
    ...     top_k: int
    >>> class Counted(StageResult):
    ...     count: int
    ...     def section(self, ctx):
    ...         return [f"Counted {self.count} pairs."]
    >>> class Count(Stage):
    ...     name = "count"
    ...     result_type = Counted
    ...     def declare(self, cfg):
    ...         return Declaration(CountParams(top_k=cfg.sampling.top_k),
    ...                            inputs={"pairs": "candidates/candidates.parquet"}, outputs=("count.json",))
    ...     def run(self, inputs, params, env):
    ...         n = inputs.table("pairs").num_rows * params.top_k
    ...         (env.out / "count.json").write_text(str(n))
    ...         return Counted(count=n)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from augsbert_ray.errors import AugSBERTError
from augsbert_ray.graph import Demand


class UndeclaredSetting(AugSBERTError):
    """A stage used an input it does not declare (a bug in the stage, not in the job)."""


# A params field that only places or sizes work (left out of the fingerprint), and one that
# names a model (fingerprinted by the model's content): the config schema's own marks.
PLACEMENT = {"placement": True}
MODEL = {"model": True}


def placement_field(default: Any = None) -> Any:
    """A params field copied from a ``placement`` setting of the config."""
    return Field(default, json_schema_extra=PLACEMENT)


def model_field(default: Any = None) -> Any:
    """A params field holding a model setting (a name or path) of the config."""
    return Field(default, json_schema_extra=MODEL)


class StageParams(BaseModel):
    """The settings a stage's ``run`` uses, built from the job config by its ``declare``.

    Config sections held as they are keep their own ``placement`` and ``model`` marks; a
    single value copied from such a setting is declared with ``placement_field`` or
    ``model_field``. A variant of a stage (a seed search on or off, a selection after
    labelling) is a field, never guessed from the inputs ``run`` was handed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class NoParams(StageParams):
    """A stage that reads no setting."""


@dataclass(frozen=True)
class SummaryContext:
    """What a result's section may know of the run besides itself."""

    task: str
    metric: str  # the task's primary metric
    complete: bool = True
    stage: str = ""  # the stage whose section is rendered


@dataclass(frozen=True)
class ScoreRow:
    """One row of a scores table in ``summary.md``: ``order`` places it among the others."""

    order: int
    title: str
    scores: Mapping[str, Mapping[str, Any]]  # split -> metric -> value
    metric: str | None = None  # the metric shown (a target row's); None: the task's primary metric


class StageResult(BaseModel):
    """What a stage's ``run`` returns: stored as JSON in its marker and in ``metrics.json``.

    A result renders its own part of ``summary.md``: ``section`` (its lines, placed in stage
    order), ``rows`` and ``target_rows`` (rows of the gold and the target scores tables), and
    ``headline`` (what the summary's title names, e.g. the sampling strategy). ``view`` is
    its part of the flat views of ``metrics.json`` that programs read (``scores``, ``data``,
    ``sampling``...); views of several results under one key are merged.
    """

    # NaN stays NaN in JSON (a model that scored every pair the same has an undefined score).
    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="constants")

    def record(self) -> dict:
        """The result as JSON-able data (numpy numbers as Python's), as markers and metrics store it."""
        return self.model_dump(mode="json", fallback=_json_fallback)

    def section(self, ctx: SummaryContext) -> list[str]:
        return []

    def rows(self, ctx: SummaryContext) -> list[ScoreRow]:
        return []

    def target_rows(self, ctx: SummaryContext) -> list[ScoreRow]:
        return []

    def headline(self) -> str | None:
        return None

    def view(self, stage: str) -> dict[str, Any]:
        return {}

    def model_scores(self) -> dict[str, dict[str, dict[str, Any]]]:
        """model -> split -> metric -> value, for the models this stage scored."""
        return {}

    def baseline_scores(self) -> dict[str, dict[str, dict[str, Any]]]:
        """baseline -> split -> metric -> value, for the baselines this stage computed."""
        return {}


def _json_fallback(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    return str(value)


class Recorded(StageResult):
    """A result this version cannot read as its stage's type (a record of another version):
    kept as it is, rendering nothing."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")


@dataclass(frozen=True)
class Declaration:
    """What a stage's result depends on, and what it writes.

    Args:
        params: the settings ``run`` gets (``StageParams``); its dump is the fingerprint's
            settings part (placement fields left out, models counted by content).
        inputs: local name -> artifact id (``"<stage>/<artifact>"``) of an earlier stage.
        outputs: artifact names this stage writes into its folder (files or directories).
        extra: anything else the result depends on that is neither config nor an artifact
            (e.g. a corpus's file names, sizes and modification times); fingerprinted as is.
    """

    params: StageParams = field(default_factory=NoParams)
    inputs: Mapping[str, str] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    extra: Any = None


@dataclass(frozen=True)
class Artifact:
    """A stage's output as later stages see it: where it is and what identifies its content."""

    path: Path
    fp: str


class Inputs:
    """A stage's declared inputs, by the local names of its declaration."""

    def __init__(self, artifacts: Mapping[str, Artifact], stage: str):
        self._artifacts = dict(artifacts)
        self._stage = stage

    def __contains__(self, name: str) -> bool:
        return name in self._artifacts

    def artifact(self, name: str) -> Artifact:
        try:
            return self._artifacts[name]
        except KeyError:
            raise UndeclaredSetting(f"stage '{self._stage}' used input '{name}', which it does not declare") from None

    def path(self, name: str) -> Path:
        return self.artifact(name).path

    def table(self, name: str):
        import pyarrow.parquet as pq

        return pq.read_table(self.path(name))

    def json(self, name: str):
        import json

        return json.loads(self.path(name).read_text(encoding="utf-8"))


def _mark(model: BaseModel, name: str, mark: str) -> bool:
    extra = type(model).model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(mark))


def _is_placement(model: BaseModel, name: str) -> bool:
    return _mark(model, name, "placement")


def _is_model(model: BaseModel, name: str) -> bool:
    return _mark(model, name, "model")


def fingerprint_settings(params: StageParams, model_id: Callable[[str], str]) -> dict:
    """The settings part of a stage's fingerprint: its params as a plain JSON-able tree, with
    placement fields, and settings added later at the default that keeps the engine's earlier
    behaviour (``config.fields.later_setting``), left out (at any depth), and model names
    replaced by their content ids."""
    return _plain(params, model_id)


def _plain(value: Any, model_id: Callable[[str], str]) -> Any:
    if isinstance(value, BaseModel):
        out = {}
        for name, info in type(value).model_fields.items():
            if _is_placement(value, name):
                continue
            v = getattr(value, name)
            if _mark(value, name, "later") and v == info.get_default(call_default_factory=True):
                continue
            out[name] = model_id(v) if _is_model(value, name) and isinstance(v, str) else _plain(v, model_id)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, model_id) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, model_id) for k, v in value.items()}
    return value


def narrowed(section: BaseModel, used: Iterable[str]) -> BaseModel:
    """A config section with only the settings a stage uses: every non-placement key outside
    ``used`` (dotted paths relative to the section) put back to its default, so that changing
    it leaves the stage's params, and its fingerprint, as they were. Placement keys stay."""
    used = set(used)
    update = {}
    for name, info in type(section).model_fields.items():
        value = getattr(section, name)
        if name in used or _is_placement(section, name):
            continue
        inner = {u[len(name) + 1:] for u in used if u.startswith(name + ".")}
        if inner and isinstance(value, BaseModel):
            update[name] = narrowed(value, inner)
        else:
            update[name] = info.get_default(call_default_factory=True)
    return section.model_copy(update=update, deep=True)


def config_leaves(model: BaseModel, prefix: str = ""):
    """Every leaf key of a config tree as (dotted path, owning model, field name).

    A section that is unset (``None``) is a leaf itself.
    """
    for name in type(model).model_fields:
        path = f"{prefix}{name}"
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from config_leaves(value, path + ".")
        else:
            yield path, model, name


_BY_NAME: dict[str, type["Stage"]] = {}
_BY_PREFIX: dict[str, type["Stage"]] = {}


def stage_class(name: str) -> type["Stage"] | None:
    """The stage class whose stages are named ``name`` (None for a name no stage class has).

    Only classes already defined are known: ``augsbert_ray.stages`` imports every stage module.
    """
    if name in _BY_NAME:
        return _BY_NAME[name]
    return next((cls for prefix, cls in _BY_PREFIX.items() if name.startswith(prefix)), None)


class Stage:
    """Base of every stage. Subclasses set ``name`` and ``result_type`` and implement
    ``declare`` and ``run``.

    Attributes:
        name: unique in a job; names the stage's folder and its entry in the report.
        result_type: the ``StageResult`` class ``run`` returns.
        needs_ray: whether ``run`` uses the cluster (Ray starts before the first such stage
            that is not reused; a job whose stages are all reused never starts Ray).
        always: run every time (cheap stages whose outputs are fingerprinted by content,
            such as loading the gold pairs), instead of being skipped when done.
        unit: what the stage's progress counts ("steps", "pairs", ...).
        publishes: artifact name -> the path in the run directory where the latest run's copy
            of that output is published (``models/cross-encoder``, ``silver.parquet``...).
        runs_after: stages this one must follow though it reads none of their outputs (an
            order of the job, e.g. no labelling before the teacher check; not fingerprinted).
        name_prefix: for a class whose instances name themselves (``Evaluate``: ``eval_<model>``),
            the prefix of those names, so that ``stage_class`` finds the class by a stage's name.

    A subclass with a ``name`` (or a ``name_prefix``) is registered when it is defined
    (``stage_class``): that is how a stored result is read back, with no list to edit.
    """

    name: str = ""
    kind: str = "stage"  # what it does, for the report: load, train, evaluate, check, candidates, label
    result_type: ClassVar[type[StageResult]] = StageResult
    needs_ray: bool = True
    always: bool = False
    loads: bool = False  # it reads the job's inputs (gold and target sets): what planning must run
    unit: str = "items"
    version: int = 1  # bump when a stage's code changes what it produces
    publishes: Mapping[str, str] = {}
    runs_after: tuple[str, ...] = ()
    name_prefix: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # the first class to claim a name keeps it (a test's stage may reuse a job's stage name)
        if cls.__dict__.get("name"):
            _BY_NAME.setdefault(cls.name, cls)
        if cls.__dict__.get("name_prefix"):
            _BY_PREFIX.setdefault(cls.name_prefix, cls)

    def declare(self, cfg) -> Declaration:  # pragma: no cover - every stage overrides it
        raise NotImplementedError

    def run(self, inputs: Inputs, params: StageParams, env) -> StageResult:  # pragma: no cover
        raise NotImplementedError

    def load_result(self, data: Any) -> StageResult | None:
        """A stored result (a marker's JSON) as this stage's result type; None where it does
        not validate (a record of another version: the stage is then redone)."""
        try:
            return self.result_type.model_validate(data, context={"stage": self.name})
        except ValidationError:
            return None

    def work(self, params: StageParams, results: Mapping[str, StageResult]) -> tuple[float, str, str | None] | None:
        """What the stage will process, for the job's ETA: (total, unit, rate key) once known
        from the results of the stages done so far, else None. Stages with the same rate key
        do the same kind of work (e.g. bi-encoder training steps), so one's rate prices the other."""
        return None

    def throughput(self, result: StageResult, seconds: float) -> str:
        """What the stage processed per second of its wall time, as a readable rate ("" if nothing)."""
        return ""

    def fixed_seconds(self, result: StageResult, seconds: float) -> float | None:
        """The part of the stage's time that does not grow with its work (starting workers,
        loading models, checkpoints), where the stage can tell; None where it cannot."""
        return None

    def host_start_seconds(self, result: StageResult) -> float | None:
        """The part of the fixed cost spent starting the job's warm host, where this stage was
        the first work of a new host (paid once per host); None otherwise."""
        return None

    def occupies(self, cfg, cluster) -> Demand:
        """What the stage holds of the cluster while it runs, so that stages run at once only
        where they fit (``graph.startable``). By default a stage that uses Ray takes every CPU
        (``cluster`` unknown: one CPU, and it runs alone) and one that does not takes nothing."""
        if not self.needs_ray:
            return Demand()
        return Demand(cpus=float(cluster.cpus) if cluster is not None else 1.0)

    def content_fingerprints(self, out: Path) -> dict[str, str] | None:
        """For ``always`` stages: each output's content fingerprint (else the stage's own)."""
        return None
