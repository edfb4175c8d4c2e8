"""Runs a job's stages: fingerprints from declarations, reuse of finished work, the graph.

Each stage's fingerprint is computed from what it declares (``stages.base.Declaration``):
its name and version, its params' dump (placement settings left out), the
fingerprints of its input artifacts, and any extra identity it names. A stage whose folder
has a valid marker (``stage_cache``) is skipped; a changed setting gives a new fingerprint,
so a new folder. An interrupted stage resumes inside its own folder (Ray Train checkpoints,
committed labelling shards). ``fresh`` empties a stage's folder before running it. After a
stage completes (or is reused), its outputs are published under fixed names
(``stage_cache.publish``). What the stages share while they run (the cluster, the warm hosts,
model shipping) is the job's ``context.JobContext``; the graph's scheduling is ``scheduler``'s.
Each stage's start and end are ``scheduler.Event``s, which the display subscribes to.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from augsbert_ray import graph, scheduler, stage_cache
from augsbert_ray.config import JobConfig
from augsbert_ray.context import JobContext, StageEnv
from augsbert_ray.errors import tag_stage
from augsbert_ray.progress.messages import prefixed
from augsbert_ray.progress.display import log_event
from augsbert_ray.rundir import RunDir, fingerprint
from augsbert_ray.scheduler import Event
from augsbert_ray.stages.base import Artifact, Inputs, Stage, StageResult, fingerprint_settings

log = logging.getLogger(__name__)


@dataclass
class Done:
    """A stage's outcome: its result, fingerprint, folder and whether an earlier run did it."""

    name: str
    fp: str
    result: StageResult
    seconds: float
    reused: bool
    folder: Path
    outputs: dict[str, Artifact] = field(default_factory=dict)


def stage_graph(cfg: JobConfig, stages: list[Stage], order: bool = True) -> dict[str, tuple[str, ...]]:
    """``stages``' graph under ``cfg``: stage -> the stages it follows (with ``order``, also
    those named in ``Stage.runs_after``; without, only those it reads from)."""
    nodes = []
    for stage in stages:
        decl = stage.declare(cfg)
        nodes.append(graph.Node(stage.name, tuple(decl.inputs.values()), tuple(decl.outputs),
                                tuple(stage.runs_after) if order else ()))
    return graph.dependencies(nodes)


class Runner:
    """Runs stages of one job in one run directory.

    Args:
        cfg: the job.
        rd: its run directory.
        fresh: redo every stage, ignoring what earlier runs finished.
        ctx: the job's context (``context.JobContext``): started (Ray, warm hosts) before the
            first stage that needs Ray and is not reused, and handed to every stage. None: a
            context that never starts Ray (for stages that do not need it).
        on_stage: called with each ``Done`` (a hook for benchmarks).
        on_start: called with a stage's name when it starts running (not when it is reused).
        progress: the job's display (``progress.JobProgress``): it subscribes to the stages'
            start and end events (``scheduler.Event``); None: log lines only.
        on_claim: called once, when the first stage is done (run or reused): the run directory
            then holds this job's work (the job writes its ``config.yaml`` there).
    """

    def __init__(self, cfg: JobConfig, rd: RunDir, *, fresh: bool = False, ctx: JobContext | None = None,
                 on_stage: Callable[[Done], None] | None = None, on_start: Callable[[str], None] | None = None,
                 progress=None, on_claim: Callable[[], None] | None = None):
        self.cfg, self.rd, self.fresh = cfg, rd, fresh
        self.ctx = ctx if ctx is not None else JobContext(progress=progress)
        self.reports = True  # its stages report their progress (not those of the autopilot's trials: ``child``)
        self.prefix = ""  # in front of every line logged while this runner runs a stage (``child``)
        self._on_claim, self._claimed = on_claim, False
        self.artifacts: dict[str, Artifact] = {}
        self.done: dict[str, Done] = {}
        self._published: dict[str, dict[str, str]] = {}  # stage name -> what it publishes (Stage.publishes)
        self._on_stage = on_stage
        self.progress = progress
        # Who hears a stage start running and end (run or reused): the display, or log lines.
        self._listeners: list[Callable[[Event], None]] = [log_event if progress is None else progress.on_event]
        if on_start is not None:
            self._listeners.append(lambda e: on_start(e.name) if e.kind == "start" else None)
        self._stages: list[Stage] = []  # every stage this runner has seen, for planning the display
        # Stages run in threads of their own (``run_graph``): the bookkeeping they share (artifacts,
        # done, publishing, the display's plan, starting the cluster) is changed under this lock.
        self._lock = threading.RLock()

    @property
    def cluster(self):
        """The cluster's resources (``runtime.ClusterResources``) once Ray has started, else None."""
        return self.ctx.cluster

    # -- fingerprints ----------------------------------------------------------------------
    def fingerprint(self, stage: Stage, cfg: JobConfig | None = None) -> str:
        """The stage's fingerprint under ``cfg`` (default: the job's), from its declaration."""
        from augsbert_ray.models import model_content_id

        cfg = cfg or self.cfg
        decl = stage.declare(cfg)
        missing = [aid for aid in decl.inputs.values() if aid not in self.artifacts]
        if missing:
            raise RuntimeError(f"stage '{stage.name}' needs {', '.join(missing)}, which no earlier stage produced")
        settings = fingerprint_settings(decl.params, model_content_id)
        inputs = {name: self.artifacts[aid].fp for name, aid in sorted(decl.inputs.items())}
        return fingerprint(stage.name, stage.version, settings, inputs, decl.extra)

    def folder(self, stage: Stage, fp: str) -> Path:
        return stage_cache.folder(self.rd, stage, fp)

    # -- running ---------------------------------------------------------------------------
    def run(self, stage: Stage, cfg: JobConfig | None = None) -> Done:
        """Runs ``stage`` unless an earlier run finished it with the same fingerprint.

        ``cfg`` runs the stage under a variant of the job's config (e.g. another teacher
        recipe); its outputs then live in that variant's folder, and are not published.
        """
        with prefixed(self.prefix):
            return self._run(stage, cfg)

    def _run(self, stage: Stage, cfg: JobConfig | None) -> Done:
        variant = cfg is not None
        cfg = cfg or self.cfg
        decl = stage.declare(cfg)
        with self._lock:
            fp = self.fingerprint(stage, cfg)
            inputs = Inputs({name: self.artifacts[aid] for name, aid in decl.inputs.items()}, stage.name)
        folder = self.folder(stage, fp)
        rel = folder.relative_to(self.rd.root).as_posix()
        record = None if (self.fresh or stage.always) else stage_cache.completed(self.rd, stage, fp)
        if record is not None:
            done = Done(stage.name, fp, record["result"], record["seconds"], True, folder)
            self._emit(Event("end", stage.name, done.seconds, result=done, reused=True))
        else:
            if self.fresh and not stage.always:
                self.rd.remove_tree(rel)
            if stage.needs_ray:
                self.ctx.ensure_started()
            folder.mkdir(parents=True, exist_ok=True)
            env = StageEnv(out=folder, storage=self.rd.storage(f"{rel}/ray"), ctx=self.ctx, rd=self.rd,
                           fresh=self.fresh, stage=stage.name, reporting=self.reports)
            self._emit(Event("start", stage.name))
            t0 = time.perf_counter()
            try:
                result = stage.run(inputs, decl.params, env)
            except BaseException as e:
                tag_stage(e, stage.name)
                if stage.always:  # nothing to resume in a loading stage: leave no half-written folder
                    self.rd.discard(rel)
                raise
            seconds = time.perf_counter() - t0
            # The stage's Arrow tables are freed now: their pages go back to the system, so a large
            # corpus's sentences and candidates do not stay in the driver for the rest of the job.
            release_arrow_memory()
            with self._lock:  # pushing a remote run directory: one at a time
                stage_cache.mark(self.rd, stage, fp, decl, result, seconds)
            self.rd.remove_tree(f"{rel}/ray")  # checkpoints of a finished stage are not needed again
            done = Done(stage.name, fp, result, seconds, False, folder)
            self._emit(Event("end", stage.name, seconds, result=done,
                             one_off_s=stage.host_start_seconds(result) or 0.0))
        content = stage.content_fingerprints(folder) or {}
        with self._lock:
            for name in decl.outputs:
                done.outputs[name] = Artifact(folder / name, content.get(name, f"{fp}/{name}"))
                if not variant:
                    self.artifacts[f"{stage.name}/{name}"] = done.outputs[name]
            if not variant:
                self.done[stage.name] = done
                self._publish_outputs(stage, done)
                self._plan_progress()
            self._claim()
            if self._on_stage is not None:
                self._on_stage(done)
        return done

    def _emit(self, event: Event) -> None:
        for listener in self._listeners:
            listener(event)

    def run_graph(self, stages: list[Stage], after: Callable[[Stage, Done], None] | None = None) -> None:
        """Runs ``stages`` as a graph (``scheduler.run``): each starts, in a thread of its own, as
        soon as the stages it follows (``graph.dependencies`` of their declarations) are done and
        it fits in what the cluster has free (``Stage.occupies``); ready stages start in
        ``stages``' order.

        Args:
            stages: the stages, in an order that runs them one after another correctly.
            after: called in this thread with each stage and its outcome as it finishes (e.g.
                the report so far), under the runner's lock, until a stage fails.

        Raises:
            the first error a stage raised, once the stages running beside it have ended; no
            stage starts after it.
        """
        by_name = {s.name: s for s in stages}
        deps = self.dependencies(stages)
        self.expect_graph(deps)
        failed = False

        def demand(name: str) -> graph.Demand:
            with self._lock:
                return by_name[name].occupies(self.cfg, self.cluster)

        def capacity() -> graph.Demand | None:
            cluster = self.cluster
            return None if cluster is None else graph.Demand(float(cluster.cpus), float(cluster.gpus))

        def before_start(name: str) -> None:
            stage = by_name[name]
            if stage.needs_ray and self.cluster is None and not self._finished_before(stage):
                self.ctx.ensure_started()  # in the scheduling thread, where signal handlers can be set

        def on_event(event: Event) -> None:
            nonlocal failed
            failed = failed or event.error is not None
            if event.kind == "end" and not failed and after is not None:
                with self._lock:
                    after(by_name[event.name], event.result)

        scheduler.run(deps, lambda name: self.run(by_name[name]), demand=demand, capacity=capacity,
                      before_start=before_start, on_event=on_event)

    def _finished_before(self, stage: Stage) -> bool:
        """Whether ``run`` will find ``stage`` done by an earlier run (its marker, by fingerprint)."""
        if self.fresh or stage.always:
            return False
        with self._lock:
            fp = self.fingerprint(stage)
        return stage_cache.finished_before(self.rd, stage, fp)

    def dependencies(self, stages: list[Stage], order: bool = True) -> dict[str, tuple[str, ...]]:
        """The stages' graph under the job's config: stage -> the stages it follows (with
        ``order``, also those named in ``Stage.runs_after``; without, only those it reads from)."""
        return stage_graph(self.cfg, stages, order)

    def _claim(self) -> None:
        if not self._claimed:
            self._claimed = True
            if self._on_claim is not None:
                self._on_claim()

    def plan(self, stages: list[Stage]) -> dict[str, str]:
        """Every stage's fingerprint without running any but those that load the job's inputs
        (``Stage.loads``), whose content the others depend on.

        Returns:
            stage name -> fingerprint.
        """
        out = {}
        for stage in stages:
            decl = stage.declare(self.cfg)
            if stage.loads:
                out[stage.name] = self.run(stage).fp
                continue
            fp = self.fingerprint(stage)
            out[stage.name] = fp
            for name in decl.outputs:
                self.artifacts[f"{stage.name}/{name}"] = Artifact(self.folder(stage, fp) / name, f"{fp}/{name}")
        return out

    # -- settings tried beside the job's own (the autopilot) ----------------------------------
    def child(self, cfg: JobConfig, log_prefix: str = "") -> "Runner":
        """A runner for another setting of this job: the same run directory and context (cluster,
        hosts, shipped models), and the artifacts found so far (the gold pairs), but its own
        record of stages; nothing it runs is published, and it reports to no display. Stages it
        shares with the job (same fingerprints) are simply reused."""
        child = Runner(cfg, self.rd, fresh=False, ctx=self.ctx)
        child.reports = False
        child.prefix = self.prefix + log_prefix  # its lines are told apart from the job's own
        child._on_claim = self._claim  # the job's run directory is claimed by whichever runs first
        child.artifacts = dict(self.artifacts)
        return child

    # -- progress display --------------------------------------------------------------------
    def expect(self, stages: list[Stage]) -> None:
        """Tells the display what work the job's stages will do, as far as it is known now."""
        self._stages = list(stages)
        for stage in self._stages:
            self._published[stage.name] = dict(stage.publishes)
        self._plan_progress()

    def expect_graph(self, deps: dict[str, tuple[str, ...]]) -> None:
        """Tells the display which stages follow which, so that the job's ETA is its critical path."""
        if self.progress is not None:
            self.progress.set_graph(deps)

    def _plan_progress(self) -> None:
        if self.progress is None:
            return
        for stage in self._stages:
            if stage.name in self.done:
                continue
            work = stage.work(stage.declare(self.cfg).params, {name: d.result for name, d in self.done.items()})
            if work is not None:
                total, unit, rate_key = work
                self.progress.plan(stage.name, total=total, unit=unit, rate_key=rate_key)

    def reporter(self, stage: str, local: bool = False):
        """``stage``'s progress reporter (see ``StageEnv.reporter``)."""
        return StageEnv(Path(), "", self.ctx, self.rd, stage=stage, reporting=self.reports).reporter(local)

    # -- publishing ------------------------------------------------------------------------
    @property
    def published(self) -> dict:
        """stage name -> {artifact: path in the run directory} the job's stages publish."""
        return {name: dict(p) for name, p in self._published.items()}

    def _publish_outputs(self, stage: Stage, done: Done) -> None:
        self._published[stage.name] = dict(stage.publishes)
        for name, target in stage.publishes.items():
            if name in done.outputs:
                stage_cache.publish(done.outputs[name].path, self.rd.path(target))


def release_arrow_memory() -> None:
    """Hands the pages Arrow's allocator keeps after frees back to the system."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
