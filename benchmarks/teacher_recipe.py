"""The teacher's recipe: cross-encoder scores for a grid of epochs and learning rates.

AugSBERT helps only when the cross-encoder beats the bi-encoder it teaches, so the teacher's
recipe matters as much as the sampling strategy. For one job, trains the cross-encoder (step
1 of the job, nothing after it) once per (epochs, lr) and writes dev and test scores of each,
next to the job's gold-only bi-encoder score when a run of the job has one.

    python benchmarks/teacher_recipe.py --job jobs/stsb-1k-bm25.yaml --epochs 4 8 --lr 2e-5 5e-5
    python benchmarks/teacher_recipe.py --recipes 4:2e-5 4:5e-5 8:5e-5     # chosen pairs only

A recipe's run directory is kept under ``--root``: a re-run reuses a finished recipe's
cross-encoder and resumes an unfinished one from its last checkpoint.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path


def train_teacher(job: str, overrides: list[str], run_dir: Path) -> dict:
    """The job's stages up to the scored cross-encoder (one run directory holds every recipe)."""
    from augsbert_ray.config import load_job
    from augsbert_ray.pipeline import run_job

    m = run_job(load_job(job, overrides + [f"run_dir={run_dir}"]), until="eval_cross_encoder")
    return {"scores": m.scores["cross_encoder"], "seconds": m.stage("cross_encoder").seconds,
            "metric": m.primary_metric}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="jobs/stsb-1k-bm25.yaml")
    p.add_argument("--epochs", type=int, nargs="+", default=[4, 8])
    p.add_argument("--lr", type=float, nargs="+", default=[2e-5, 5e-5])
    p.add_argument("--recipes", nargs="+", metavar="EPOCHS:LR", help="chosen (epochs, lr) pairs instead of the grid")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--gold-only", type=Path, help="metrics.json of a run of the job, for its gold-only score")
    p.add_argument("--root", type=Path, help="run directories (default: a temporary folder)")
    p.add_argument("--out", default="benchmarks/results/teacher_recipe")
    args = p.parse_args(argv)

    from provenance import provenance, write_result

    root = args.root or Path(tempfile.mkdtemp(prefix="augsbert-teacher-"))
    rows = []
    recipes = ([(int(r.split(":")[0]), float(r.split(":")[1])) for r in args.recipes] if args.recipes
               else list(itertools.product(args.epochs, args.lr)))
    for epochs, lr in recipes:
        run_dir = root / "shared"
        r = train_teacher(args.job, args.extra + [f"cross_encoder.epochs={epochs}", f"cross_encoder.lr={lr}"], run_dir)
        rows.append({"epochs": epochs, "lr": lr, **r})
    metric = rows[0]["metric"]
    lines = [f"# Teacher recipe: {args.job}", "",
             f"Cross-encoder {metric} x100 per recipe (the job's other settings; "
             + (f"overrides {' '.join(args.extra)}" if args.extra else "no overrides") + ").", "",
             "| epochs | lr | dev | test | training s |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["scores"]
        lines.append(f"| {r['epochs']} | {r['lr']:g} | {s['dev'][metric]:.2f} | {s['test'][metric]:.2f} | "
                     f"{r['seconds']:.0f} |")
    if args.gold_only:
        g = json.loads(args.gold_only.read_text())["scores"]["gold_only"]
        lines += ["", f"Gold-only bi-encoder of `{args.gold_only}`: dev {g['dev'][metric]:.2f}, test "
                      f"{g['test'][metric]:.2f}."]
    lines += ["", *provenance("benchmarks/teacher_recipe.py", argv)]
    write_result(args.out, lines, {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()}})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
