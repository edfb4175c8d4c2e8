"""What a job's stages share while it runs: the cluster, the warm hosts, the progress channel,
the models shipped to workers and the inputs its pre-flight checks read.

``pipeline.run_job`` builds one ``JobContext`` per job and closes it when the job ends. Ray
starts when the first stage that needs it runs (``ensure_started``; a job whose stages were
all done earlier never starts it). Stages reach the context through their ``StageEnv``,
and every choice that depends on it is made here and passed down explicitly: where a training
runs (``training_executor``), whether small work runs on the warm hosts (``hosts_serving``).
No module-level state decides either.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from augsbert_ray.training.executors import Executor, choose_executor
from augsbert_ray.workers import HostPool, hosts_serve

if TYPE_CHECKING:
    from augsbert_ray.rundir import RunDir


class JobContext:
    """One job's cluster-side resources.

    Args:
        start: starts (or joins) Ray and returns the cluster's resources
            (``runtime.ClusterResources``); None: the job never starts Ray (its stages must
            not need it).
        progress: the job's display (``progress.JobProgress``); with one, Ray workers report
            to it through a progress channel opened once Ray has started.
        track: the job is tracked (``tracking``): workers report through a progress channel even
            without a display, so that the trainings' loss and learning rate reach the driver.
        inputs: the gold and target sets the pre-flight checks read
            (``loaders.job_inputs.JobInputs``), which the loading stages write instead of
            reading them again; None: they read them.
    """

    def __init__(self, start: Callable[[], Any] | None = None, progress=None, track: bool = False, inputs=None):
        self._start = start
        self.inputs = inputs
        self.progress = progress
        self.track = track
        self.cluster = None
        self.hosts: HostPool | None = None  # the warm hosts (``workers``), once Ray has started
        self.channel = None  # progress.channel.ProgressChannel, once Ray has started
        self._shipped: dict[str, Any] = {}
        self._lock = threading.RLock()  # stages start in threads of their own

    def ensure_started(self):
        """Starts Ray now if no stage has yet (once, whichever stage asks first); returns the
        cluster's resources (None without a ``start``)."""
        with self._lock:
            if self.cluster is None and self._start is not None:
                self.cluster = self._start()
                self.hosts = HostPool()  # hosts start when work first needs one
                if self.progress is not None or self.track:
                    from augsbert_ray.progress.channel import ProgressChannel, Uncounted

                    # Ray workers report to the display; without one, their lines and training
                    # points still reach the driver's log and the tracker
                    self.channel = ProgressChannel(self.progress if self.progress is not None else Uncounted())
            return self.cluster

    def close(self) -> None:
        """Ends the job's warm hosts and the progress channel (Ray itself is the caller's)."""
        with self._lock:
            hosts, self.hosts = self.hosts, None
            channel, self.channel = self.channel, None
        if hosts is not None:
            hosts.close()
        if channel is not None:
            channel.close()

    # -- where work runs -----------------------------------------------------------------------
    def training_executor(self, num_workers: int, use_gpu: bool, storage: str) -> Executor:
        """Where a training of ``num_workers`` workers (``use_gpu``) with checkpoints in
        ``storage`` runs: a warm host or a Ray Train worker group (``executors.choose_executor``)."""
        return choose_executor(self.hosts, num_workers, use_gpu, storage)

    def hosts_serving(self) -> HostPool | None:
        """The warm hosts where small work (scoring, sampling, labelling) may run on them
        (``workers.hosts_serve``), else None: that work then runs as Ray tasks and actors."""
        hosts = self.hosts
        return hosts if hosts_serve(hosts) else None

    # -- models --------------------------------------------------------------------------------
    def ship(self, path):
        """A model directory of this run, put in the object store once for workers on any node."""
        from augsbert_ray.models import ship_model

        key = str(path)
        with self._lock:
            if key not in self._shipped:
                self._shipped[key] = ship_model(path)
            return self._shipped[key]

    def base_model(self, name: str):
        """A configured starting model as workers should get it: a name they resolve, or shipped files."""
        from augsbert_ray.models import EMBEDDED_MODEL, ship_if_local

        if name == EMBEDDED_MODEL:
            return name  # installed with the package on every node; each checks its hash
        with self._lock:
            if name not in self._shipped:
                self._shipped[name] = ship_if_local(name)
            return self._shipped[name]


@dataclass
class StageEnv:
    """What a running stage gets besides its inputs and settings.

    Attributes:
        out: the stage's own folder; outputs go here (resumable state too).
        storage: where this stage's Ray workers write to storage themselves (Ray Train / Tune
            checkpoints; labelling shards under a remote run directory): a path, or a URI under a
            remote run directory; removed once the stage is done.
        ctx: the job's context (``context.JobContext``): the cluster, warm hosts, model shipping.
        rd: the run directory (a stage that commits work as it goes pushes it: ``rd.push``).
        fresh: the stage must not resume anything.
        stage: the stage's name.
        reporting: the stage reports to the job's display (a runner of the autopilot's trials does not).
    """

    out: Path
    storage: str
    ctx: JobContext
    rd: RunDir
    fresh: bool = False
    stage: str = ""
    reporting: bool = True

    @property
    def cluster(self):
        return self.ctx.cluster

    @property
    def hosts(self):
        """The job's warm hosts where small work may run on them, else None (``JobContext.hosts_serving``)."""
        return self.ctx.hosts_serving()

    def ship(self, path):
        return self.ctx.ship(path)

    def base_model(self, name: str):
        return self.ctx.base_model(name)

    def executor(self, training):
        """Where this stage's training runs under the job's ``training`` settings
        (``JobContext.training_executor``)."""
        return self.ctx.training_executor(training.num_workers, training.use_gpu, self.storage)

    def reporter(self, local: bool = False):
        """This stage's ``progress.StageProgress`` (None without a display or a channel): picklable
        for Ray workers through the job's progress channel, or ``local`` (driver only)."""
        if not self.reporting:
            return None
        progress, channel = self.ctx.progress, self.ctx.channel
        if local or channel is None:
            return None if progress is None else progress.stage(self.stage)
        return channel.handle.stage(self.stage)
