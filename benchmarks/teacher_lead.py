"""How far the teacher leads the gold-only student on dev, against what AugSBERT then gained.

Reads results of ``heldout_recipe.py`` or ``pilot_check.py`` (rows and their runs' metrics) in which
both students count each gold pair as often (the engine's reference since gold-only counts
``gold_repeat``), and lists, per run, the teacher's lead on dev (what the teacher check reports
before labelling) beside AugSBERT - gold only on test with its paired bootstrap interval. It writes
the table (``--out``) and the engine's copy of the figures (``augsbert_ray/teacher_lead_data.py``),
which the teacher check quotes; ``--check`` fails when that copy is not current.

    python benchmarks/teacher_lead.py \\
        --source "MiniLM teacher=benchmarks/results/heldout_recipe_matched.json:gold10" \\
        --source "MPNet teacher, silver first=benchmarks/results/mpnet_teacher_lowres.json:silver-first" \\
        --source "MPNet teacher=benchmarks/results/pilot_check_mrpc_mpnet.json" \\
        --source "MPNet teacher, silver first=benchmarks/results/mrpc_1k_mpnet.json"

A source's optional ``:VARIANT`` keeps only the rows of that recipe variant (``heldout_recipe.py``)
or job (``pilot_check.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "augsbert_ray" / "teacher_lead_data.py"
DEFAULT_SOURCES = ["MiniLM teacher=benchmarks/results/heldout_recipe_matched.json:gold10",
                   "MPNet teacher, silver first=benchmarks/results/mpnet_teacher_lowres.json:silver-first",
                   "MPNet teacher=benchmarks/results/pilot_check_mrpc_mpnet.json",
                   "MPNet teacher, silver first=benchmarks/results/mrpc_1k_mpnet.json"]
PRIMARY = {"regression": "spearman", "binary": "f1"}


def parse_source(text: str) -> tuple[str, Path, str | None]:
    """``TEACHER=JSON[:VARIANT]`` as (teacher, file, variant or None for every row)."""
    teacher, sep, rest = text.partition("=")
    path, _, variant = rest.partition(":")
    if not sep or not teacher or not path:
        raise ValueError(f"source '{text}': expected TEACHER=JSON[:VARIANT]")
    return teacher, Path(path), variant or None


def points(teacher: str, data: dict, variant: str | None) -> list[dict]:
    """One measured point per run: the task, the teacher, the seed, the teacher's lead on dev and
    AugSBERT - gold only on test (with its interval)."""
    out = []
    for row in data["rows"]:
        if variant is not None and row.get("variant", row.get("job")) != variant:
            continue
        if "job" in row:  # a pilot_check.py row: one job per task, its runs keyed by job and seed
            task, key = row["job"], f"{row['job']} seed {row['seed']}"
        else:
            task, key = row["task"], f"{row['task']} {row.get('variant', row.get('objective'))} seed {row['seed']}"
        m = data["runs"][key]
        metric = PRIMARY[m["task"]]
        lead = m["scores"]["cross_encoder"]["dev"][metric] - m["scores"]["gold_only"]["dev"][metric]
        gain = row["test_gain"]
        out.append({"task": task, "teacher": teacher, "seed": row["seed"], "metric": metric,
                    "lead_dev": round(lead, 2),
                    "gain_test": round(gain["difference"], 2), "low": round(gain["low"], 2),
                    "high": round(gain["high"], 2)})
    return sorted(out, key=lambda p: (p["lead_dev"], p["task"], p["seed"]))


def render_data(pts: list[dict], sources: list[str]) -> str:
    """``augsbert_ray/teacher_lead_data.py``'s text."""
    lines = ['"""Measured: the teacher\'s lead over the gold-only student on dev, and AugSBERT - gold only on',
             "test (paired bootstrap, 90% interval), per run. Written by benchmarks/teacher_lead.py from",
             *[f"{s}," for s in sources[:-1]], f"{sources[-1]}; do not edit by hand", '"""', "",
             "MEASURED = ("]
    lines += [f"    {p!r}," for p in pts]
    return "\n".join([*lines, ")", ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", dest="sources", action="append", default=[], metavar="TEACHER=JSON[:VARIANT]")
    p.add_argument("--out", default="benchmarks/results/teacher_lead")
    p.add_argument("--check", action="store_true", help="fail if augsbert_ray/teacher_lead_data.py is not current")
    args = p.parse_args(argv)
    sources = args.sources or DEFAULT_SOURCES
    pts = []
    for teacher, path, variant in map(parse_source, sources):
        pts += points(teacher, json.loads((REPO / path).read_text(encoding="utf-8")), variant)
    pts.sort(key=lambda q: (q["metric"] != "spearman", q["lead_dev"], q["task"], q["seed"]))
    text = render_data(pts, [s.split("=", 1)[1] for s in sources])
    if args.check:
        if DATA.read_text(encoding="utf-8") != text:
            print(f"{DATA} is not current: run python benchmarks/teacher_lead.py", file=sys.stderr)
            return 1
        return 0
    DATA.write_text(text, encoding="utf-8")
    sys.path.insert(0, str(Path(__file__).parent))
    from provenance import provenance, write_result

    lines = ["# The teacher's lead on dev against AugSBERT's gain on test", "",
             "Each row is one run in which both students count each gold pair as often. Lead: the "
             "teacher's dev score minus the gold-only student's, as the teacher check reports it before "
             "labelling; gain: AugSBERT - gold only on the task's test set, with the paired bootstrap's 90% "
             "interval. Sources: " + "; ".join(f"`{s}`" for s in sources) + ".", "",
             "| task | teacher | metric | student seed | teacher lead, dev | AugSBERT - gold only, test |",
             "|---|---|---|---:|---:|---|"]
    lines += [f"| {q['task']} | {q['teacher']} | {q['metric']} | {q['seed']} | {q['lead_dev']:+.2f} | "
              f"{q['gain_test']:+.2f} ({q['low']:+.2f} to {q['high']:+.2f}) |" for q in pts]
    write_result(args.out, [*lines, "", *provenance("benchmarks/teacher_lead.py", argv)], {"points": pts})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
