"""Runs a job's stages: fingerprints from declarations, reuse of finished work, publishing.

Each stage's fingerprint is computed from what it declares (``stages.base.Declaration``):
its name and version, its params' dump (placement settings left out), the
fingerprints of its input artifacts, and any extra identity it names. A stage's outputs
live in ``stages/<name>/<fingerprint[:16]>/`` of the run directory with a marker
(``done.json``: the fingerprint, the stage's result and each output's size) written
last, so a folder with a marker is complete. A stage whose folder has a valid marker is
skipped; a changed setting gives a new fingerprint, so a new folder: work of another
configuration is never resumed or overwritten (switching a setting back reuses it). An
interrupted stage resumes inside its own folder (Ray Train checkpoints, committed
labelling shards). ``fresh`` empties a stage's folder before running it.

After a stage completes (or is reused), the outputs it names in ``Stage.publishes`` are
published under fixed names in the run directory (``models/cross-encoder``,
``silver.parquet``...) as hard links, so the latest configuration's artifacts are always
where the README says.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from augsbert_ray import graph
from augsbert_ray.config import JobConfig
from augsbert_ray.messages import prefixed
from augsbert_ray.rundir import RunDir, fingerprint
from augsbert_ray.stages.base import Artifact, Declaration, Inputs, Stage, StageResult, fingerprint_settings

log = logging.getLogger(__name__)
MARKER = "done.json"


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


@dataclass
class StageEnv:
    """What a running stage gets besides its inputs and settings.

    Attributes:
        out: the stage's own folder; outputs go here (resumable state too).
        storage: where Ray Train / Tune may keep this stage's checkpoints (a path, or a URI
            under a remote run directory).
        runner: the job's runner, for the cluster and model shipping (``ship``,
            ``base_model``, ``cluster``).
        fresh: the stage must not resume anything.
    """

    out: Path
    storage: str
    runner: "Runner"
    fresh: bool = False

    @property
    def cluster(self):
        return self.runner.cluster

    def ship(self, path):
        return self.runner.ship(path)

    def base_model(self, name: str):
        return self.runner.base_model(name)

    def reporter(self, local: bool = False):
        """This stage's ``progress.StageProgress`` for the job's display (None without one):
        picklable for Ray workers through the job's progress channel, or ``local`` (driver only)."""
        return self.runner.reporter(self.stage, local=local)

    stage: str = ""


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
        start_cluster: called (once) before the first stage that needs Ray and is not
            reused; returns the cluster's resources.
        on_stage: called with each ``Done`` (a hook for progress displays and benchmarks).
        on_start: called with a stage's name when it starts running (not when it is reused).
        progress: the job's display (``progress.JobProgress``); None: log lines only.
        on_claim: called once, when the first stage is done (run or reused): the run directory
            then holds this job's work (the job writes its ``config.yaml`` there).
        track: the job is tracked (``tracking``): workers report through a progress channel even
            without a display, so that the trainings' loss and learning rate reach the driver.
    """

    def __init__(self, cfg: JobConfig, rd: RunDir, *, fresh: bool = False,
                 start_cluster: Callable[[], Any] | None = None,
                 on_stage: Callable[[Done], None] | None = None, on_start: Callable[[str], None] | None = None,
                 progress=None, on_claim: Callable[[], None] | None = None, track: bool = False):
        self.cfg, self.rd, self.fresh = cfg, rd, fresh
        self.track = track
        self.prefix = ""  # in front of every line logged while this runner runs a stage (``child``)
        self._on_claim, self._claimed = on_claim, False
        self.artifacts: dict[str, Artifact] = {}
        self.done: dict[str, Done] = {}
        self.cluster = None
        self._start_cluster = start_cluster
        self._published: dict[str, dict[str, str]] = {}  # stage name -> what it publishes (Stage.publishes)
        self._on_stage = on_stage
        self._on_start = on_start
        self._shipped: dict[str, Any] = {}
        self.progress = progress
        self.channel = None  # progress_channel.ProgressChannel, once Ray has started
        self._stages: list[Stage] = []  # every stage this runner has seen, for planning the display
        # Stages run in threads of their own (``run_graph``): the bookkeeping they share (artifacts,
        # done, publishing, the display's plan, starting the cluster) is changed under this lock.
        self._lock = threading.RLock()

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
        return self.rd.path("stages", stage.name, fp[:16])

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
        record = None if (self.fresh or stage.always) else self._completed(stage, fp, rel)
        if record is not None:
            done = Done(stage.name, fp, record["result"], record["seconds"], True, folder)
            if self.progress is not None:
                self.progress.finish_stage(stage.name, done.seconds, reused=True)
            else:
                log.info(f"[{stage.name}] complete in an earlier run; skipped")
        else:
            if self.fresh and not stage.always:
                self.rd.remove_tree(rel)
            if stage.needs_ray:
                self.ensure_cluster()
            folder.mkdir(parents=True, exist_ok=True)
            env = StageEnv(out=folder, storage=self.rd.storage(f"{rel}/ray"), runner=self,
                           fresh=self.fresh, stage=stage.name)
            if self.progress is not None:
                self.progress.start_stage(stage.name)
            else:
                log.info(f"[{stage.name}] started")
            if self._on_start is not None:
                self._on_start(stage.name)
            t0 = time.perf_counter()
            try:
                result = stage.run(inputs, decl.params, env)
            except BaseException:
                if stage.always:  # nothing to resume in a loading stage: leave no half-written folder
                    self.rd.discard(rel)
                raise
            seconds = time.perf_counter() - t0
            # The stage's Arrow tables are freed now: their pages go back to the system, so a large
            # corpus's sentences and candidates do not stay in the driver for the rest of the job.
            release_arrow_memory()
            with self._lock:  # pushing a remote run directory: one at a time
                self._mark(stage, fp, rel, decl, result, seconds)
            self.rd.remove_tree(f"{rel}/ray")  # checkpoints of a finished stage are not needed again
            done = Done(stage.name, fp, result, seconds, False, folder)
            if self.progress is not None:
                self.progress.finish_stage(stage.name, seconds, one_off_s=stage.host_start_seconds(result) or 0.0)
            else:
                log.info(f"[{stage.name}] done in {seconds:.1f}s")
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

    def run_graph(self, stages: list[Stage], after: Callable[[Stage, Done], None] | None = None) -> None:
        """Runs ``stages`` as a graph: each starts, in a thread of its own, as soon as the stages it
        follows (``graph.dependencies`` of their declarations) are done and it fits in what the
        cluster has free (``Stage.occupies``); ready stages start in ``stages``' order.

        Args:
            stages: the stages, in an order that runs them one after another correctly.
            after: called in this thread with each stage and its outcome as it finishes (e.g.
                the report so far), under the runner's lock.

        Raises:
            the first error a stage raised, once the stages running beside it have ended; no
            stage starts after it.
        """
        by_name = {s.name: s for s in stages}
        deps = self.dependencies(stages)
        self.expect_graph(deps)
        finished: list[tuple[Stage, Done | None, BaseException | None]] = []
        wake = threading.Condition()
        running: dict[str, graph.Demand] = {}
        done: set[str] = set()
        error: BaseException | None = None

        def work(stage: Stage) -> None:
            try:
                outcome, exc = self.run(stage), None
            except BaseException as e:  # noqa: BLE001 - handed to the job's thread, which raises it
                outcome, exc = None, e
            with wake:
                finished.append((stage, outcome, exc))
                wake.notify()

        while True:
            if error is None:
                with self._lock:
                    cluster = self.cluster
                    demand = {name: by_name[name].occupies(self.cfg, cluster) for name in graph.ready(deps, done, running)}
                capacity = None if cluster is None else graph.Demand(float(cluster.cpus), float(cluster.gpus))
                for name in graph.startable(deps, done, running, demand, capacity):
                    if by_name[name].needs_ray and self.cluster is None and not self._finished_before(by_name[name]):
                        # Ray starts in this thread, where signal handlers can be set
                        self.ensure_cluster()
                    running[name] = demand[name]
                    threading.Thread(target=work, args=(by_name[name],), name=f"stage-{name}", daemon=True).start()
            if not running:
                break
            with wake:
                while not finished:
                    wake.wait(0.5)  # wakes now and then, so that Ctrl-C reaches this thread
                stage, outcome, exc = finished.pop(0)
            del running[stage.name]
            if exc is not None:
                error = error or exc
                continue
            done.add(stage.name)
            if after is not None and error is None:
                with self._lock:
                    after(stage, outcome)
        if error is not None:
            raise error

    def _finished_before(self, stage: Stage) -> bool:
        """Whether ``run`` will find ``stage`` done by an earlier run (its marker, by fingerprint)."""
        if self.fresh or stage.always:
            return False
        with self._lock:
            fp = self.fingerprint(stage)
        marker = self.folder(stage, fp) / MARKER
        try:
            return json.loads(marker.read_text(encoding="utf-8")).get("fingerprint") == fp
        except (OSError, ValueError):
            return False

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
    def ensure_cluster(self):
        """Starts Ray now if no stage has yet (once, whichever stage asks first)."""
        with self._lock:
            if self.cluster is None and self._start_cluster is not None:
                self.cluster = self._start_cluster()
            if self.cluster is not None:
                from augsbert_ray.workers import open_pool

                open_pool()  # warm hosts for the job's training and scoring (started on first use)
            return self.cluster

    def child(self, cfg: JobConfig, log_prefix: str = "") -> "Runner":
        """A runner for another setting of this job: the same run directory, cluster and
        shipped models, and the artifacts found so far (the gold pairs), but its own record
        of stages; nothing it runs is published, and it reports to no display. Stages it
        shares with the job (same fingerprints) are simply reused."""
        child = Runner(cfg, self.rd, fresh=False, start_cluster=self.ensure_cluster)
        child.prefix = self.prefix + log_prefix  # its lines are told apart from the job's own
        child.cluster = self.cluster
        child._shipped = self._shipped
        child.channel = None
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
        if local or self.channel is None:
            return None if self.progress is None else self.progress.stage(stage)
        return self.channel.handle.stage(stage)

    def open_channel(self) -> None:
        """Lets Ray workers report to the display (once Ray has started); without a display, to
        the driver's log alone where the job is tracked (the trainings' points travel with it)."""
        if self.channel is None and (self.progress is not None or self.track):
            from augsbert_ray.progress_channel import ProgressChannel, Uncounted

            self.channel = ProgressChannel(self.progress if self.progress is not None else Uncounted())

    def close(self) -> None:
        from augsbert_ray.workers import close_pool

        close_pool()  # the job's warm hosts end with it
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    # -- markers ---------------------------------------------------------------------------
    def _completed(self, stage: Stage, fp: str, rel: str) -> dict | None:
        marker = self.rd.path(rel, MARKER)
        if not marker.exists():
            return None
        try:
            record = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if record.get("fingerprint") != fp:
            return None
        changed = [name for name, sig in record.get("outputs", {}).items()
                   if self.rd.signature(f"{rel}/{name}") != sig]
        if changed:
            log.info(f"[{stage.name}] completed earlier, but {', '.join(changed)} is missing or changed; redoing it")
            return None
        result = stage.load_result(record.get("result"))
        if result is None:
            log.info(f"[{stage.name}] completed earlier, but its recorded result is of another version; redoing it")
            return None
        return {**record, "result": result}

    def _mark(self, stage: Stage, fp: str, rel: str, decl: Declaration, result: StageResult,
              seconds: float) -> None:
        outputs = {name: self.rd.signature(f"{rel}/{name}") for name in decl.outputs}
        missing = [name for name, sig in outputs.items() if sig is None]
        if missing:
            raise RuntimeError(f"stage '{stage.name}' did not write {', '.join(missing)}")
        record = {"stage": stage.name, "fingerprint": fp, "seconds": seconds, "result": result.record(),
                  "outputs": outputs}
        self.rd.write_text(f"{rel}/{MARKER}", json.dumps(record, indent=2, default=str))
        self.rd.push()

    # -- publishing ------------------------------------------------------------------------
    @property
    def published(self) -> dict:
        """stage name -> {artifact: path in the run directory} the job's stages publish."""
        return {name: dict(p) for name, p in self._published.items()}

    def _publish_outputs(self, stage: Stage, done: Done) -> None:
        self._published[stage.name] = dict(stage.publishes)
        for name, target in stage.publishes.items():
            if name in done.outputs:
                publish(done.outputs[name].path, self.rd.path(target))

    # -- models ----------------------------------------------------------------------------
    def ship(self, path):
        """A model directory of this run, put in the object store once for workers on any node."""
        from augsbert_ray.models import ship_model

        key = str(path)
        if key not in self._shipped:
            self._shipped[key] = ship_model(path)
        return self._shipped[key]

    def base_model(self, name: str):
        """A configured starting model as workers should get it: a name they resolve, or shipped files."""
        from augsbert_ray.models import EMBEDDED_MODEL

        if name == EMBEDDED_MODEL:
            return name  # installed with the package on every node; each checks its hash
        from augsbert_ray.models import ship_if_local

        if name not in self._shipped:
            self._shipped[name] = ship_if_local(name)
        return self._shipped[name]


def publish(source: Path, target: Path) -> None:
    """Makes ``target`` hold ``source``'s content (a file or a directory tree), as hard links
    where the file system allows (copies elsewhere); replaces whatever ``target`` was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.publishing")
    _remove(tmp)
    if source.is_dir():
        shutil.copytree(source, tmp, copy_function=_link_or_copy)
    else:
        _link_or_copy(source, tmp)
    old = target.with_name(f".{target.name}.old")
    _remove(old)
    if target.exists() or target.is_symlink():
        os.replace(target, old)
    os.replace(tmp, target)
    _remove(old)


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def release_arrow_memory() -> None:
    """Hands the pages Arrow's allocator keeps after frees back to the system."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
