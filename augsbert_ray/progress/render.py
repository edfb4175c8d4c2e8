"""The bars a terminal shows: one row per stage (``[3/8] gold_only``) with the stage's unit,
rate, elapsed time and ETA, and a last row for the whole job (rich renderables)."""

from __future__ import annotations

from augsbert_ray.progress.eta import (DONE, FAILED, PENDING, REUSED, RUNNING, SKIPPED, JobModel, eta_text,
                                       format_count, format_duration, format_rate)

BAR_WIDTH = 28
MARKS = {PENDING: " ", RUNNING: "…", DONE: "✓", REUSED: "↷", FAILED: "✗", SKIPPED: "-"}
STYLES = {PENDING: "dim", REUSED: "dim", SKIPPED: "dim", FAILED: "red"}


def bar_width(model: JobModel, terminal_width: int) -> int:
    """28 columns, narrower on a narrow terminal (down to 10), so the figures fit."""
    label = max(len(model.label(s)) for s in model.stages.values())
    return max(10, min(BAR_WIDTH, terminal_width - label - 60))


def render(model: JobModel, now: float, started: float, terminal_width: int):
    """The display's table at ``now`` (a job started at ``started``)."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)  # state mark
    grid.add_column(no_wrap=True)  # [i/n] stage
    width = bar_width(model, terminal_width)
    grid.add_column(no_wrap=True, width=width)
    grid.add_column(no_wrap=True, overflow="ellipsis")  # amount, rate, times
    for s in model.stages.values():
        style = STYLES.get(s.state, "")
        label = Text(model.label(s), style=style)
        if s.state in (PENDING, REUSED, SKIPPED):
            grid.add_row(MARKS[s.state], label, "", Text(s.note or "waiting", style="dim"))
            continue
        if s.total:
            bar = ProgressBar(total=s.total, completed=min(s.done, s.total), width=width)
        elif s.state == RUNNING:  # its size is not known yet
            bar = ProgressBar(total=None, width=width, pulse=True, animation_time=now)
        else:
            bar = ProgressBar(total=1, completed=1, width=width)
        amount = (f"{format_count(s.done)}/{format_count(s.total)} {s.unit}" if s.total is not None
                  else (f"{format_count(s.done)} {s.unit}" if s.done else ""))
        if s.state == RUNNING:
            eta = s.eta(now)
            # the ETA first: on a narrow terminal the end of the line is cut
            parts = [amount, f"ETA {format_duration(eta)}" if eta is not None else "",
                     format_rate(s.rate(now), s.unit), f"{format_duration(now - s.started)} elapsed"]
        else:
            parts = [amount, f"done in {format_duration(s.seconds or 0.0)}" if s.state == DONE else s.note]
        grid.add_row(MARKS[s.state], label, bar, Text("  ".join(p for p in parts if p), style=style))
    finished = sum(s.state in (DONE, REUSED) for s in model.stages.values())
    eta, basis = model.job_eta(now)
    parts = [f"{finished}/{len(model.stages)} stages"]
    if eta_text(eta, basis):
        parts.append(eta_text(eta, basis)[len("job "):]
                     + (f" ({len(basis['unestimated'])} stage(s) not yet estimated)" if basis["unestimated"] else ""))
    elif basis["unestimated"]:
        parts.append(f"ETA not yet known ({len(basis['unestimated'])} stage(s) not yet estimated)")
    parts.append(f"{format_duration(now - started)} elapsed")
    grid.add_row("", Text("job", style="bold"), ProgressBar(total=len(model.stages), completed=finished, width=width),
                 "  ".join(parts))
    return grid
