"""The README main job's recipe on data it was not tuned on: STSb's genres as tasks of their own.

The main job's recipe (teacher 4 epochs at 5e-5, BM25+SS top-10, a 2-layer student at 1e-4 with
gold counted 10 times) was chosen on 1,000 pairs drawn from all of STSb's training set (task
``stsb``). Here each genre is a task: its own training pairs (up to 1,000, drawn as the job draws
them), its own dev set, which the shipping decision reads, and its own test set. Each task runs
the job once per recipe variant and student seed in one run directory, so the teacher, the
candidates and the silver labels are made once per task and only what a variant changes is made
again.

For each run: the teacher, gold only and AugSBERT on test, the share of the student-teacher gap
AugSBERT closes, ``(augsbert - gold_only) / (teacher - gold_only)`` with both students trained
with the same variant, and the paired bootstrap interval of AugSBERT - gold only on test. With
more than one variant, each later variant's AugSBERT is compared with the first's on the same
task and seed, on dev (where a recipe is chosen) and on test, by the same paired bootstrap.

    python benchmarks/heldout_recipe.py --tasks captions news forums --objectives cosine cosent \\
        --seeds 1 2 --root /tmp/heldout --out benchmarks/results/heldout_recipe_genres
    python benchmarks/heldout_recipe.py --tasks stsb news --variant job: \\
        --variant isotonic:labeling.calibration=isotonic --seeds 1 2 --out /tmp/calibration

A variant is a name and the job overrides it makes (``NAME:KEY=VALUE,KEY=VALUE``); without
``--variant``, each of ``--objectives`` is one, named by the objective. ``--merge`` puts an
earlier result's runs in the same table, so seeds run on different days (or machines: each run
keeps its own metrics) are read side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

JOB = "jobs/stsb-1k-student2.yaml"
# "stsb": all of STSb, the data the recipe was chosen on; then its genres as the stsb loader
# reads them (the files spell forums "main-forum" in train)
TASKS = ("stsb", "captions", "news", "forums")


def gap_closed(teacher: float, gold_only: float, augsbert: float) -> float:
    """Per cent of the student-teacher gap that AugSBERT closes; NaN where the teacher is not ahead."""
    gap = teacher - gold_only
    return (augsbert - gold_only) / gap * 100 if gap > 0 else float("nan")


def task_overrides(task: str) -> list[str]:
    """The job's overrides that make ``task`` (a genre, or all of STSb) its training, dev and test data."""
    if task not in TASKS:
        raise ValueError(f"unknown task '{task}'; valid: {', '.join(TASKS)}")
    if task == "stsb":
        return []
    return [f"data.{split}.genres=[{task}]" for split in ("train", "dev", "test")]


def variant_of(row: dict) -> str:
    """A row's recipe variant; rows written before variants existed are named by their objective."""
    return row.get("variant", row["objective"])


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` (a recipe variant and its job overrides) as (name, overrides)."""
    name, sep, rest = text.partition(":")
    overrides = [o for o in rest.split(",") if o]
    if not sep or not name or any("=" not in o for o in overrides):
        raise ValueError(f"variant '{text}': expected NAME:KEY=VALUE[,KEY=VALUE...]")
    return name, overrides


def _dev(row: dict) -> str:
    return f"{row['augsbert_dev']:.2f}" if row.get("augsbert_dev") is not None else "-"  # older rows: not kept


def _key(row: dict) -> str:
    return f"{row['task']} {variant_of(row)} seed {row['seed']}"


def merged(files: list[Path]) -> tuple[list[dict], dict]:
    """The rows and raw runs of earlier results (``--merge``), in their order; a later file's
    run of the same task, objective and seed replaces an earlier one."""
    rows, raw = [], {}
    for f in files:
        data = json.loads(Path(f).read_text(encoding="utf-8"))
        for row in data["rows"]:
            rows = [r for r in rows if _key(r) != _key(row)] + [row]
        raw.update(data.get("runs", {}))
    return rows, raw


def ordered(rows: list[dict]) -> list[dict]:
    """Rows by task (``TASKS``' order), variant (as first seen) and seed."""
    variants = list(dict.fromkeys(variant_of(r) for r in rows))
    return sorted(rows, key=lambda r: (TASKS.index(r["task"]), variants.index(variant_of(r)), r["seed"]))


def summarise(rows: list[dict]) -> list[str]:
    """Per task and variant: the mean gap closed and the worst AugSBERT - gold only on test."""
    lines = []
    for task in dict.fromkeys(r["task"] for r in rows):
        for variant in dict.fromkeys(variant_of(r) for r in rows if r["task"] == task):
            mine = [r for r in rows if r["task"] == task and variant_of(r) == variant]
            closed = [r["gap_closed"] for r in mine]
            worst = min(r["augsbert_test"] - r["gold_only_test"] for r in mine)
            lines.append(f"- {task}, {variant}: mean gap closed {sum(closed) / len(closed):.1f}% over "
                         f"{len(mine)} seed(s); smallest AugSBERT - gold only on test {worst:+.2f}")
    return lines


def paired_against(base: dict, other: dict, seed: int = 0) -> dict[str, dict]:
    """Per split, the paired bootstrap of ``other``'s AugSBERT - ``base``'s, from the two finished
    runs' saved predictions (their metrics dicts)."""
    import numpy as np
    from pilot_check import saved_predictions

    from augsbert_ray.evaluation import paired_bootstrap

    out = {}
    for split in ("dev", "test"):
        (pred_a, labels_a), (pred_b, labels_b) = (saved_predictions(m, "augsbert", split) for m in (base, other))
        if len(labels_a) != len(labels_b) or not np.allclose(labels_a, labels_b):
            raise ValueError(f"the two runs' {split} predictions are not of the same pairs")
        out[split] = paired_bootstrap("regression", pred_a, pred_b, labels_a, seed=seed)
    return out


def comparisons(rows: list[dict], raw: dict) -> list[str]:
    """Each variant after a task's first, against that first one with the same seed: AugSBERT's
    difference on dev and on test with its paired bootstrap interval."""
    lines = []
    for task in dict.fromkeys(r["task"] for r in rows):
        names = list(dict.fromkeys(variant_of(r) for r in rows if r["task"] == task))
        for name in names[1:]:
            for r in (r for r in rows if r["task"] == task and variant_of(r) == name):
                base = raw.get(f"{task} {names[0]} seed {r['seed']}")
                if base is None or _key(r) not in raw:
                    continue
                d = paired_against(base, raw[_key(r)])
                lines.append(f"- {task}, seed {r['seed']}, {name} - {names[0]}: " + "; ".join(
                    f"{split} {g['difference']:+.2f} ({g['low']:+.2f} to {g['high']:+.2f})" for split, g in d.items()))
    return lines


def with_dev(row: dict, m: dict) -> dict:
    """``row`` with what rows written before these columns lack, from its run's metrics: the
    teacher's and gold only's dev scores and AugSBERT - gold only on dev (paired bootstrap)."""
    from pilot_check import split_gain

    if "dev_gain" in row:
        return row
    dev = {k: v["dev"][PRIMARY[m["task"]]] for k, v in m["scores"].items() if "dev" in v}
    return {**row, "teacher_dev": dev["cross_encoder"], "gold_only_dev": dev["gold_only"],
            "dev_gain": split_gain(m, row["seed"], "dev")}


PRIMARY = {"regression": "spearman", "binary": "f1"}


def _interval(g: dict) -> str:
    return f"{g['difference']:+.2f} ({g['low']:+.2f} to {g['high']:+.2f})"


def render(rows: list[dict], raw: dict, job: str, argv) -> list[str]:
    """The result file's lines: a row per run, then the summary and the variants' comparisons."""
    from provenance import provenance

    header = ["# The job's recipe on STSb and on its genres, each a task of its own", "",
              f"Job `{job}`, each task's own train (up to 1,000 pairs), dev and test pairs. Spearman x100 on "
              "the task's test set (dev columns: on its dev set); teacher lead: the teacher's dev score minus "
              "the gold-only student's, as the teacher check reports it before labelling; gap closed: "
              "(AugSBERT - gold only) / (teacher - gold only) on test, both students trained with the same "
              "recipe variant and seed; intervals: the paired bootstrap's 90% interval of AugSBERT - gold only.", "",
              "| task | train pairs | variant | objective | student seed | teacher | gold only | AugSBERT | "
              "AugSBERT dev | teacher lead (dev) | gap closed | AugSBERT - gold only, dev | "
              "AugSBERT - gold only, test | silver pairs | shipped | run, s |",
              "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---:|"]
    table = []
    for r in ordered(rows):
        lead = f"{r['teacher_dev'] - r['gold_only_dev']:+.2f}" if r.get("teacher_dev") is not None else "-"
        dev_gain = _interval(r["dev_gain"]) if r.get("dev_gain") else "-"
        table.append(f"| {r['task']} | {r['train_pairs']} | {variant_of(r)} | {r['objective']} | {r['seed']} | "
                     f"{r['teacher_test']:.2f} | {r['gold_only_test']:.2f} | {r['augsbert_test']:.2f} | "
                     f"{_dev(r)} | {lead} | {r['gap_closed']:.1f}% | {dev_gain} | {_interval(r['test_gain'])} | "
                     f"{r['silver']} | {r['shipped']} | {r['run_seconds']:.0f} |")
    versus = comparisons(ordered(rows), raw)
    return [*header, *table, "", *summarise(ordered(rows)), "",
            *(["AugSBERT against the first variant of its task, same seed (paired bootstrap, 90% "
               "interval):", *versus, ""] if versus else []),
            *provenance("benchmarks/heldout_recipe.py", argv)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default=JOB)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument("--objectives", nargs="+", default=["cosine", "cosent"],
                   help="a variant per student objective, named by it")
    p.add_argument("--variant", dest="variants", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="a recipe variant of its own (job overrides); given, it replaces --objectives' variants")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="the students' seeds (bi_encoder.seed)")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--root", type=Path, default=Path("runs/heldout-recipe"))
    p.add_argument("--out", default="benchmarks/results/heldout_recipe_genres")
    p.add_argument("--merge", type=Path, action="append", default=[], metavar="JSON",
                   help="an earlier result of this script (its .json): its runs head the table, and a run "
                        "made again here (same task, objective and seed) replaces its row")
    p.add_argument("--render-only", action="store_true",
                   help="run nothing: write the table of the --merge results (with the dev columns added)")
    args = p.parse_args(argv)

    from pilot_check import test_gain
    from provenance import write_result

    from augsbert_ray.config import load_job
    from augsbert_ray.pipeline import run_job

    variants = ([parse_variant(v) for v in args.variants] if args.variants
                else [(o, [f"bi_encoder.objective={o}"]) for o in args.objectives])
    rows, raw = merged(args.merge)
    rows = [with_dev(r, raw[_key(r)]) if _key(r) in raw else r for r in rows]
    if args.render_only:
        write_result(args.out, render(rows, raw, args.job, argv), {"rows": rows, "runs": raw})
        print("\n".join(summarise(rows)))
        return 0
    for task in args.tasks:
        for variant, variant_overrides in variants:
            for seed in args.seeds:
                overrides = [*task_overrides(task), *args.extra, *variant_overrides,
                             f"bi_encoder.seed={seed}", f"run_dir={args.root / task}"]
                t0 = time.perf_counter()
                cfg = load_job(args.job, overrides)
                m = run_job(cfg).to_dict()
                s = {k: v["test"]["spearman"] for k, v in m["scores"].items() if "test" in v}
                gain = test_gain(m, seed)
                row = {"task": task, "train_pairs": m["data"]["train"], "variant": variant,
                       "overrides": variant_overrides, "objective": cfg.bi_encoder.objective, "seed": seed,
                       "teacher_test": s["cross_encoder"], "gold_only_test": s["gold_only"],
                       "augsbert_test": s["augsbert"], "augsbert_dev": m["scores"]["augsbert"]["dev"]["spearman"],
                       "zero_shot_test": s.get("zero_shot"),
                       "gap_closed": gap_closed(s["cross_encoder"], s["gold_only"], s["augsbert"]),
                       "test_gain": gain, "silver": (m.get("sampling") or {}).get("silver"),
                       "shipped": m["shipped"]["shipped"], "run_seconds": sum(m["stage_seconds"].values()),
                       "wall_s": time.perf_counter() - t0}
                row = with_dev(row, m)
                rows = [r for r in rows if _key(r) != _key(row)] + [row]
                raw[_key(row)] = m
                print(json.dumps(row, default=str), flush=True)
                # after every run: a kill keeps the rest
                write_result(args.out, render(rows, raw, args.job, argv), {"rows": rows, "runs": raw})
    print("\n".join(summarise(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
