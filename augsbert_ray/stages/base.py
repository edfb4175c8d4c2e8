"""What a stage is: the config it reads, the artifacts it takes and writes, and ``run``.

A stage declares everything its result depends on (``Declaration``): the dotted config
paths it reads (a whole section or single keys), its inputs (artifacts of earlier stages,
by id) and the artifacts it writes. The runner (``augsbert_ray.runner``) derives the
stage's fingerprint from exactly that, so a stage is redone when, and only when, something
it declared changed; settings marked ``placement`` in the config (actors, CPUs, GPUs, batch
sizes, workers) are readable but never part of a fingerprint, and model settings count by
the model's content. A stage sees the config through ``Settings``, which refuses to read
anything not declared: a fingerprint cannot silently miss a setting the stage uses.

Example:
    >>> class Count(Stage):
    ...     name = "count"
    ...     def declare(self, cfg):
    ...         return Declaration(reads=("sampling.top_k",), inputs={"pairs": "candidates/candidates.parquet"},
    ...                            outputs=("count.json",))
    ...     def run(self, inputs, settings, env):
    ...         n = inputs.table("pairs").num_rows * settings.sampling.top_k
    ...         (env.out / "count.json").write_text(str(n))
    ...         return {"count": n}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import BaseModel

from augsbert_ray.errors import AugSBERTError
from augsbert_ray.graph import Demand


class UndeclaredSetting(AugSBERTError):
    """A stage read a config key it does not declare (a bug in the stage, not in the job)."""


@dataclass(frozen=True)
class Declaration:
    """What a stage's result depends on, and what it writes.

    Args:
        reads: dotted config paths, each a section (``cross_encoder``) or a key
            (``labeling.precision``). Everything under a declared section is readable;
            its non-placement keys are fingerprinted.
        inputs: local name -> artifact id (``"<stage>/<artifact>"``) of an earlier stage.
        outputs: artifact names this stage writes into its folder (files or directories).
        extra: anything else the result depends on that is neither config nor an artifact
            (e.g. a corpus's file names, sizes and modification times); fingerprinted as is.
    """

    reads: tuple[str, ...] = ()
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


def _is_placement(model: BaseModel, name: str) -> bool:
    extra = type(model).model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("placement"))


def _is_model(model: BaseModel, name: str) -> bool:
    extra = type(model).model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("model"))


def _covered(path: str, declared: frozenset[str]) -> bool:
    """``path`` is declared or lies under a declared section."""
    parts = path.split(".")
    return any(".".join(parts[:i]) in declared for i in range(1, len(parts) + 1))


def _on_the_way(path: str, declared: frozenset[str]) -> bool:
    """``path`` is a section above a declared key (reading it gives a view, not values)."""
    return any(d.startswith(path + ".") for d in declared)


class Settings:
    """A read-only view of the job config that allows only a stage's declared paths.

    Attribute access walks the config (``settings.cross_encoder.epochs``); a section comes
    back as another view, a key as its value. Reading a key that is neither declared nor
    under a declared section raises ``UndeclaredSetting``. Methods and properties of a
    config section are available where the whole section is declared.
    """

    __slots__ = ("_node", "_path", "_declared", "_stage")

    def __init__(self, node: BaseModel, declared: frozenset[str], stage: str, path: str = ""):
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_declared", declared)
        object.__setattr__(self, "_stage", stage)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        path = f"{self._path}.{name}" if self._path else name
        node = self._node
        if name not in type(node).model_fields:  # a method or property of the section
            if self._path and _covered(self._path, self._declared):
                return getattr(node, name)
            raise UndeclaredSetting(f"stage '{self._stage}' used '{path}'; only a stage that declares all of "
                                    f"'{self._path or 'the job'}' may")
        value = getattr(node, name)
        if _covered(path, self._declared):
            return Settings(value, self._declared, self._stage, path) if isinstance(value, BaseModel) else value
        if _on_the_way(path, self._declared) and isinstance(value, BaseModel):
            return Settings(value, self._declared, self._stage, path)
        raise UndeclaredSetting(f"stage '{self._stage}' read '{path}', which it does not declare")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("stage settings are read-only")

    def __repr__(self) -> str:
        return f"Settings({self._stage}: {self._path or 'job'})"


def declared_value(cfg: BaseModel, path: str, model_id: Callable[[str], str]) -> Any:
    """The fingerprinted value of a declared path: placement keys left out, model names
    replaced by their content ids, sections as plain JSON-able trees."""
    node: Any = cfg
    parent, name = None, None
    for part in path.split("."):
        if not isinstance(node, BaseModel) or part not in type(node).model_fields:
            raise KeyError(f"no config key '{path}'")
        parent, name, node = node, part, getattr(node, part)
    if parent is not None and _is_placement(parent, name):
        return None
    if parent is not None and _is_model(parent, name) and isinstance(node, str):
        return model_id(node)
    return _plain(node, model_id)


def _plain(value: Any, model_id: Callable[[str], str]) -> Any:
    if isinstance(value, BaseModel):
        out = {}
        for name in type(value).model_fields:
            if _is_placement(value, name):
                continue
            v = getattr(value, name)
            out[name] = model_id(v) if _is_model(value, name) and isinstance(v, str) else _plain(v, model_id)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, model_id) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, model_id) for k, v in value.items()}
    return value


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


class Stage:
    """Base of every stage. Subclasses set ``name`` and implement ``declare`` and ``run``.

    Attributes:
        name: unique in a job; names the stage's folder and its entry in the report.
        needs_ray: whether ``run`` uses the cluster (Ray starts before the first such stage
            that is not reused; a job whose stages are all reused never starts Ray).
        always: run every time (cheap stages whose outputs are fingerprinted by content,
            such as loading the gold pairs), instead of being skipped when done.
        unit: what the stage's progress counts ("steps", "pairs", ...).
        publishes: artifact name -> the path in the run directory where the latest run's copy
            of that output is published (``models/cross-encoder``, ``silver.parquet``...).
        runs_after: stages this one must follow though it reads none of their outputs (an
            order of the job, e.g. no labelling before the teacher check; not fingerprinted).
    """

    name: str = ""
    kind: str = "stage"  # what it does, for the report: load, train, evaluate, check, candidates, label
    needs_ray: bool = True
    always: bool = False
    loads: bool = False  # it reads the job's inputs (gold and target sets): what planning must run
    unit: str = "items"
    version: int = 1  # bump when a stage's code changes what it produces
    publishes: Mapping[str, str] = {}
    runs_after: tuple[str, ...] = ()

    def declare(self, cfg) -> Declaration:  # pragma: no cover - every stage overrides it
        raise NotImplementedError

    def run(self, inputs: Inputs, settings: Settings, env) -> dict:  # pragma: no cover
        raise NotImplementedError

    def work(self, cfg, results: dict[str, dict]) -> tuple[float, str, str | None] | None:
        """What the stage will process, for the job's ETA: (total, unit, rate key) once known
        from the results of the stages done so far, else None. Stages with the same rate key
        do the same kind of work (e.g. bi-encoder training steps), so one's rate prices the other."""
        return None

    def throughput(self, result: dict, seconds: float) -> str:
        """What the stage processed per second of its wall time, as a readable rate ("" if nothing)."""
        return ""

    def fixed_seconds(self, result: dict, seconds: float) -> float | None:
        """The part of the stage's time that does not grow with its work (starting workers,
        loading models, checkpoints), where the stage can tell; None where it cannot."""
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
