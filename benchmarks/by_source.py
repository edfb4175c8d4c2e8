"""An STSb run's models scored per source: where AugSBERT's gain over gold only is made or lost.

STSb's pairs come from a dozen sources (``MSRvid 2012test``, ``headlines 2015``,
``answer-answer 2016`` ...), and its test set holds sources that its training and dev sets do not.
The pooled Spearman also rewards a model for placing the sources' scores well against each other,
so a student that ranks the pairs better within every source can still lose on the pooled set.
This script reads a finished run directory of an STSb job (its gold-only and AugSBERT students,
its teacher) and prints, for dev and test: each source's Spearman x100 per model, AugSBERT - gold
only with the paired bootstrap's 90% interval, and each model's mean score against the mean gold
label (a model that rates one source's pairs too similar shows there).

    python benchmarks/by_source.py RUN_DIR --out benchmarks/results/NAME

The STSb files are read from ``$AUGSBERT_DATA_DIR/stsb`` (or the folders the jobs search).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

MODELS = {"gold only": "bi-encoder-gold-only", "AugSBERT": "bi-encoder-augsbert", "teacher": "cross-encoder"}


def read_split(split: str) -> dict[str, list]:
    """An STSb split as columns: source (``<file> <year>``), gold in [0, 1], the two sentences."""
    from augsbert_ray.data_fetch import default_roots

    for root in default_roots():
        path = root / "stsb" / f"sts-{split}.csv"
        if path.is_file():
            break
    else:
        raise SystemExit(f"sts-{split}.csv not found under {[str(r) for r in default_roots()]}: "
                         "run `augsbert data fetch stsb` or set AUGSBERT_DATA_DIR")
    cols: dict[str, list] = {"source": [], "gold": [], "s1": [], "s2": []}
    with open(path, encoding="utf-8", newline="") as f:
        for line_no, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if len(row) < 7:
                raise SystemExit(f"{path}, line {line_no}: {len(row)} fields, expected 7")
            cols["source"].append(f"{row[1]} {row[2]}")
            cols["gold"].append(float(row[4]) / 5)
            cols["s1"].append(row[5])
            cols["s2"].append(row[6])
    return cols


def predictions(run_dir: Path, data: dict[str, list]) -> dict[str, np.ndarray]:
    """Each model's scores of the pairs: cosine for the students, the cross-encoder's for the teacher."""
    from sentence_transformers import CrossEncoder, SentenceTransformer

    out = {}
    for name, folder in MODELS.items():
        path = run_dir / "models" / folder
        if name == "teacher":
            out[name] = np.asarray(CrossEncoder(str(path), device="cpu").predict(
                list(zip(data["s1"], data["s2"])), batch_size=64, show_progress_bar=False), np.float64)
        else:
            model = SentenceTransformer(str(path), device="cpu")
            a, b = (model.encode(data[k], batch_size=64, normalize_embeddings=True, show_progress_bar=False)
                    for k in ("s1", "s2"))
            out[name] = (a * b).sum(1).astype(np.float64)
    return out


def by_source(data: dict[str, list], preds: dict[str, np.ndarray]) -> list[dict]:
    """One row per source (then ``all``): pairs, Spearman x100 and mean score per model, the gain."""
    from augsbert_ray.evaluation import paired_bootstrap, spearman100

    sources = np.asarray(data["source"])
    gold = np.asarray(data["gold"])
    rows = []
    for source in [*sorted(set(data["source"])), "all"]:
        mask = np.ones(len(gold), bool) if source == "all" else sources == source
        row = {"source": source, "pairs": int(mask.sum()), "gold_mean": float(gold[mask].mean())}
        for name, p in preds.items():
            row[name] = spearman100(p[mask], gold[mask])
            row[f"{name} mean"] = float(p[mask].mean())
        boot = paired_bootstrap("regression", preds["gold only"][mask], preds["AugSBERT"][mask], gold[mask])
        row["gain"] = {k: boot[k] for k in ("difference", "low", "high")}
        rows.append(row)
    return rows


def render(run_dir: Path, tables: dict[str, list[dict]], argv: list[str]) -> str:
    import os

    from augsbert_ray.bench.hardware import cpu_description, versions

    lines = [f"# Scores per STSb source: `{run_dir}`", "",
             ("Spearman x100 per source; AugSBERT - gold only with the paired bootstrap's 90% interval; "
             "mean score: each model's mean prediction on the source against the mean gold label (in [0, 1])."), ""]
    for split, rows in tables.items():
        lines += [f"## {split}", "",
                  ("| source | pairs | gold only | AugSBERT | teacher | AugSBERT - gold only (interval) "
                  "| mean gold | mean gold only | mean AugSBERT | mean teacher |"),
                  "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
        for r in rows:
            g = r["gain"]
            lines.append(f"| {r['source']} | {r['pairs']} | {r['gold only']:.2f} | {r['AugSBERT']:.2f} | "
                         f"{r['teacher']:.2f} | {g['difference']:+.2f} ({g['low']:+.2f} to {g['high']:+.2f}) | "
                         f"{r['gold_mean']:.3f} | {r['gold only mean']:.3f} | {r['AugSBERT mean']:.3f} | "
                         f"{r['teacher mean']:.3f} |")
        per = [r for r in rows if r["source"] != "all"]
        wins = sum(r["AugSBERT"] > r["gold only"] for r in per)
        macro = np.mean([r["AugSBERT"] - r["gold only"] for r in per])
        lines += ["", (f"AugSBERT ahead of gold only in {wins} of {len(per)} sources; mean of the per-source "
                  f"differences {macro:+.2f}; pooled {rows[-1]['gain']['difference']:+.2f}."), ""]
    lines += [f"Command: `python benchmarks/by_source.py {' '.join(argv)}`", f"Machine: {cpu_description()}, {os.cpu_count()} cores. Versions: "
              + ", ".join(f"{k} {v}" for k, v in versions().items()) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="a finished STSb job's run directory (its models/ folder)")
    ap.add_argument("--splits", nargs="+", default=["dev", "test"], choices=["train", "dev", "test"])
    ap.add_argument("--out", type=Path, help="writes OUT.md and OUT.json")
    args = ap.parse_args(argv)
    missing = [f for f in MODELS.values() if not (args.run_dir / "models" / f).is_dir()]
    if missing:
        raise SystemExit(f"{args.run_dir / 'models'}: no {', '.join(missing)} (a finished run of a job with "
                         "baselines.gold_only and AugSBERT is needed)")
    tables = {}
    for split in args.splits:
        data = read_split(split)
        tables[split] = by_source(data, predictions(args.run_dir, data))
    text = render(args.run_dir, tables, argv)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps({"run_dir": str(args.run_dir), "splits": tables},
                                                            indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
