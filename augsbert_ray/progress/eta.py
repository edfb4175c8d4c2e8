"""The job's stages as the display counts them, and the job's ETA: pure (no clock, no I/O).

Each stage may declare its work before it starts (``plan``): a count of units (``total``
training steps, pairs to label, sentences to search) or a time (``estimate_s``). A planned
count becomes seconds with what that kind of work cost when it was last done in this job: a
finished stage of the same ``rate_key`` (e.g. ``bi_encoder step``), else of the same unit,
gives its seconds per unit inside its loop (from its first report to its last) plus the rest
of its time (start-up, model loading, evaluation), which the next stage of its kind pays
again; without one, the running rate of a stage now doing that kind of work prices the units
alone. The running stage counts its own remaining units at its own rate. The job ETA is the
longest chain, through the job's graph, of the stages not finished; while any stage has no
estimate it is a lower bound (``ETA >= 0:09:40``) and the stages left out are named.
"""

from __future__ import annotations

from dataclasses import dataclass

PENDING, RUNNING, DONE, REUSED, FAILED, SKIPPED = "pending", "running", "done", "reused", "failed", "skipped"
FINISHED = (DONE, REUSED, FAILED, SKIPPED)


def format_duration(seconds: float | None) -> str:
    """``H:MM:SS`` (as rich and tqdm show durations); ``-:--:--`` when unknown."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "-:--:--"
    s = int(round(max(0.0, seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _singular(unit: str) -> str:
    return unit[:-1] if unit.endswith("s") and len(unit) > 1 else unit


def format_rate(rate: float | None, unit: str) -> str:
    """``3.1 steps/s``, or ``12.3 s/step`` when slower than one unit a second (tqdm's habit)."""
    if not rate:
        return ""
    if rate >= 1:
        return f"{rate:,.1f} {unit}/s"
    return f"{1 / rate:,.1f} s/{_singular(unit)}"


def format_count(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


@dataclass
class StageState:
    name: str
    unit: str = "steps"
    total: float | None = None
    done: float = 0.0
    estimate_s: float | None = None  # declared time of the whole stage, when known
    rate_key: str | None = None  # stages sharing a key share their measured cost per unit
    state: str = PENDING
    started: float | None = None
    ended: float | None = None
    seconds: float | None = None  # as the caller measured it (a reused stage: its earlier run)
    one_off_s: float = 0.0  # of seconds: paid once for the job (starting a warm host), not again by its kind
    note: str = ""
    # the running rate: work done since the first report, over the time since then
    first_at: float | None = None
    last_at: float | None = None  # when the last report came
    done_at_first: float = 0.0
    last_line: float | None = None  # when the last plain progress line was written

    @property
    def key(self) -> str:
        return self.rate_key or self.unit

    def rate(self, now: float) -> float | None:
        if self.first_at is None or now <= self.first_at or self.done <= self.done_at_first:
            return None
        return (self.done - self.done_at_first) / (now - self.first_at)

    def eta(self, now: float) -> float | None:
        r = self.rate(now)
        if self.total is None or not r:
            return None
        return max(0.0, self.total - self.done) / r


class JobModel:
    """The stages of one job, in order, with what their work cost so far (see the module).

    Args:
        stages: the job's stages in order; a stage reported later that is not listed is
            appended (and the count grows).
    """

    def __init__(self, stages: list[str]):
        self.stages: dict[str, StageState] = {name: StageState(name) for name in stages}
        # rate key / unit -> (seconds per unit in the stage's loop, seconds of start-up and wrap-up, measured on)
        self.cost: dict[str, tuple[float, float, str]] = {}
        self.deps: dict[str, tuple[str, ...]] = {}  # stage -> the stages it follows (set_graph)

    def get(self, name: str) -> StageState:
        if name not in self.stages:
            self.stages[name] = StageState(name)
        return self.stages[name]

    def label(self, s: StageState) -> str:
        """``[3/8] gold_only``."""
        return f"[{list(self.stages).index(s.name) + 1}/{len(self.stages)}] {s.name}"

    def plan(self, name: str, total: float | None = None, unit: str | None = None,
             estimate_s: float | None = None, rate_key: str | None = None) -> None:
        s = self.get(name)
        if total is not None:
            s.total = float(total)
        if unit is not None:
            s.unit = unit
        if estimate_s is not None:
            s.estimate_s = float(estimate_s)
        if rate_key is not None:
            s.rate_key = rate_key

    def set_total(self, name: str, total: float, unit: str | None = None) -> None:
        s = self.get(name)
        s.total = float(total)
        if unit is not None:
            s.unit = unit

    def set_graph(self, deps: dict[str, tuple[str, ...]]) -> None:
        self.deps = {name: tuple(before) for name, before in deps.items()}

    def measure(self, s: StageState) -> None:
        """Records what a finished stage's work cost, to price planned stages of its kind: the
        seconds per unit inside its loop (from the first report to the last) and the rest of
        its time (start-up, model loading, evaluation), which the next stage pays again, less
        what it paid once for the job (``one_off_s``)."""
        rate = s.rate(s.last_at) if s.last_at is not None else None
        if rate:
            per = 1.0 / rate
            overhead = max(0.0, s.seconds - s.total * per - s.one_off_s)
        elif s.seconds > 0:  # a single report: the whole stage, per unit
            per, overhead = s.seconds / s.total, 0.0
        else:
            return
        self.cost[s.key] = (per, overhead, s.name)
        self.cost.setdefault(s.unit, self.cost[s.key])

    def job_eta(self, now: float) -> tuple[float | None, dict]:
        """Seconds left in the job at ``now`` and the basis of the figure.

        Returns:
            ``(seconds, basis)``: seconds is the longest chain, through the job's graph
            (``set_graph``), of the estimates of the stages not finished (None when no stage
            has one); basis holds ``"rates"`` (stage -> the rate that priced it and where it
            was measured) and ``"unestimated"`` (stages without an estimate, so the figure is
            then a lower bound).
        """
        known, rates, unestimated, left_s = False, {}, [], {}
        for s in self.stages.values():
            if s.state in FINISHED:
                continue
            eta = s.eta(now) if s.state == RUNNING else None
            left = None if s.total is None else max(0.0, s.total - s.done)
            if eta is not None:
                rates[s.name] = f"{format_rate(s.rate(now), s.unit)} now"
            elif left is not None and (s.key in self.cost or s.unit in self.cost):
                per, overhead, where = self.cost.get(s.key) or self.cost[s.unit]
                if s.state == RUNNING and s.started is not None:  # part of the start-up is behind it
                    overhead = max(0.0, overhead - (now - s.started))
                eta = left * per + overhead
                rates[s.name] = (f"{format_rate(1 / per, s.unit)}"
                                 + (f" + {format_duration(overhead)} start-up" if overhead >= 1 else "")
                                 + f" in {where}")
            elif left is not None and self._running_rate(s, now) is not None:
                r = self._running_rate(s, now)
                eta = left / r.rate(now)
                rates[s.name] = f"{format_rate(r.rate(now), s.unit)} in {r.name} so far"
            elif s.estimate_s is not None:
                elapsed = now - s.started if s.state == RUNNING and s.started is not None else 0.0
                eta = max(0.0, s.estimate_s - elapsed)
                rates[s.name] = "as declared"
            if eta is None:
                unestimated.append(s.name)
            else:
                left_s[s.name], known = eta, True
        return (self._longest_chain(left_s) if known else None), {"rates": rates, "unestimated": unestimated}

    def _longest_chain(self, left_s: dict[str, float]) -> float:
        from augsbert_ray.graph import critical_path

        names = list(self.stages)
        # a stage outside the graph (or with no graph at all) follows every stage listed before it
        deps = {n: tuple(d for d in self.deps[n] if d in self.stages) if n in self.deps else tuple(names[:i])
                for i, n in enumerate(names)}
        return critical_path(deps, left_s)

    def _running_rate(self, s: StageState, now: float) -> StageState | None:
        """Another running stage whose rate prices ``s``: same rate key, else same unit."""
        others = [r for r in self.stages.values() if r.state == RUNNING and r is not s and r.rate(now)]
        return next((r for r in others if r.key == s.key), None) or next((r for r in others if r.unit == s.unit), None)


def eta_text(eta: float | None, basis: dict) -> str:
    """``job ETA 0:09:40``; ``job ETA >= 0:09:40`` while some stage has no estimate; "" when unknown."""
    if eta is None or (basis["unestimated"] and eta < 1):
        return ""
    return f"job ETA {'>= ' if basis['unestimated'] else ''}{format_duration(eta)}"


def basis_text(basis: dict) -> str:
    """Which rate priced which stage, and the stages not yet estimated, on one line."""
    parts = [f"{name} at {how}" for name, how in basis["rates"].items()]
    if basis["unestimated"]:
        parts.append(f"not yet estimated: {', '.join(basis['unestimated'])}")
    return "; ".join(parts)
