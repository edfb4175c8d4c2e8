"""A ``BenchReport`` as Markdown, and its plot of pairs/s against actors."""

from __future__ import annotations

from pathlib import Path

from augsbert_ray.bench.records import BenchReport, PartResult

PLOT = "labelling_actors.png"


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit.startswith(("recall", "share")):
        return f"{v:.4f}"
    if unit in ("s", "MiB") or abs(v) < 10:
        return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,.0f}"


def part_markdown(p: PartResult) -> list[str]:
    """One part's section: its table (each figure with its ratio to the peer it names), notes,
    and the error of a part that failed."""
    head = {"ok": "", "failed": " (failed)", "skipped": " (skipped)"}.get(p.status, f" ({p.status})")
    lines = [f"## {p.title}{head}", ""]
    if p.error:
        lines += [f"**{'Error' if p.status == 'failed' else 'Why'}:** {p.error}", ""]
    if p.measures:
        lines += ["| measure | value | unit | vs peer | how |", "|---|---:|---|---:|---|"]
        for m in p.measures:
            r = p.ratio(m)
            who = {"peer": "peer: ", "info": ""}.get(m.side, "")
            lines.append(f"| {who}{m.name} | {_value(m.value, m.unit)} | {m.unit} | "
                         f"{'' if r is None else f'{r:.2f}x'} | {m.note} |")
        lines.append("")
    lines += [*[f"- {n}" for n in p.notes], *([""] if p.notes else [])]
    if p.seconds:
        lines += [f"_Part took {p.seconds:.0f} s._", ""]
    return lines


def markdown(report: BenchReport, plot: str | None = None, plot_note: str = "") -> str:
    """The whole report: the machine and versions first, then each part in the order run."""
    hw, v = report.hardware, report.versions
    gpus = ", ".join(hw.get("gpus") or []) or "none"
    load = report.load_average
    load_text = "; ".join(f"{k} {', '.join(f'{x:.2f}' for x in xs)}" for k, xs in load.items() if xs)
    lines = [f"# augsbert bench ({report.mode})", "",
             f"Command: `{report.command}`. Started {report.started}.", "",
             f"- CPU: {hw.get('cpu', '?')}" + (f" ({hw['cpu_features']})" if hw.get("cpu_features") else "")
             + f", {hw.get('cores', '?')} cores, {hw.get('memory', '?')} memory",
             f"- GPUs: {gpus}",
             f"- Ray cluster: {report.cluster or 'not started'}",
             f"- Load average (1, 5, 15 min): {load_text or 'unknown'}"
             + " (other work on the machine slows every figure here alike)",
             "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()), ""]
    failed = [p.part for p in report.parts if p.status == "failed"]
    if failed:
        lines += [f"Parts that failed: {', '.join(failed)} (their errors are in their sections).", ""]
    for p in report.parts:
        lines += part_markdown(p)
    if plot:
        lines += [f"![pairs/s against labelling actors]({plot})", ""]
    if plot_note:
        lines += [plot_note, ""]
    return "\n".join(lines)


def actor_series(report: BenchReport) -> dict[str, list[tuple[int, float]]]:
    """The labelling part's pairs/s per number of actors, by series (start included, steady)."""
    p = report.part("labelling")
    series = (p.data.get("actors") if p else None) or {}
    return {name: [(int(a), float(r)) for a, r in points if r is not None] for name, points in series.items()}


def plot(report: BenchReport, out: Path) -> tuple[str | None, str]:
    """Writes the plot of pairs/s against actors into ``out``.

    Returns:
        (the plot's file name or None, a note saying why there is none).
    """
    series = {k: pts for k, pts in actor_series(report).items() if pts}
    if not series:
        return None, "No plot: the labelling part measured no actor pool."
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "No plot: matplotlib is not installed."
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name, pts in series.items():
        ax.plot([a for a, _ in pts], [r for _, r in pts], marker="o", label=name)
    lab = report.part("labelling")
    for name, rate in ((lab.data.get("peer_lines") or {}).items() if lab else []):
        ax.axhline(rate, linestyle="--", linewidth=1, color="grey")
        ax.annotate(name, (1, rate), textcoords="offset points", xytext=(2, 3), fontsize=7, color="grey")
    ax.set_xlabel("labelling actors")
    ax.set_ylabel("pairs/s")
    ax.set_xticks(sorted({a for pts in series.values() for a, _ in pts}))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"Labelling: pairs/s against actors ({report.mode})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / PLOT, dpi=120)
    plt.close(fig)
    return PLOT, ""
