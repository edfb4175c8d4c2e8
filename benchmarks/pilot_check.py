"""Does the pilot predict whether AugSBERT beats gold only on test?

For each job and bi-encoder seed, the job runs with ``evaluation.pilot=true`` (one run
directory per job, so the seeds share the teacher, candidates and labels): the student
trained for ``evaluation.pilot_fraction`` of its steps on gold alone and on gold + silver,
both scored on dev (with ``--set evaluation.pilot_folds=5``, on 5 folds of the gold training
pairs), and the paired bootstrap's interval of the gain. The job then trains both to the
end; the table sets the pilot's verdict (helps, does not help, or no prediction when the gain
is within what the pilots were scored on can tell apart) against AugSBERT - gold only on
test, with the same bootstrap's interval on test (each model at the F1 threshold dev chose
for it): where that interval spans 0, the test set itself cannot tell the difference from
chance.

    python benchmarks/pilot_check.py --jobs jobs/stsb-1k-student2.yaml jobs/mrpc-bm25.yaml \\
        --seeds 1 2 --set bi_encoder.num_layers=2
    python benchmarks/pilot_check.py --jobs jobs/mrpc-bm25.yaml --set bi_encoder.num_layers=2 \\
        --set evaluation.pilot_folds=5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def saved_predictions(m: dict, model: str, split: str):
    """A model's predictions on ``split`` as its evaluation stage saved them
    (``eval_<model>/predictions.parquet``): (predictions, labels)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fps = {s["name"]: s["fingerprint"] for s in m["stages"]}
    table = pq.read_table(Path(m["run_dir"]) / "stages" / f"eval_{model}" / fps[f"eval_{model}"][:16] / "predictions.parquet")
    table = table.filter(pc.equal(table["split"], split))
    return table["prediction"].to_numpy(), table["label"].to_numpy()


def split_gain(m: dict, seed: int, split: str = "test") -> dict:
    """The paired bootstrap's interval of AugSBERT - gold only on ``split``, from the run's saved
    predictions, each model at its own dev threshold."""
    from augsbert_ray.evaluation import paired_bootstrap

    preds = {model: saved_predictions(m, model, split) for model in ("gold_only", "augsbert")}
    thresholds = {model: m["scores"][model][split].get("threshold") for model in preds}
    (gold_pred, labels), (aug_pred, aug_labels) = preds["gold_only"], preds["augsbert"]
    assert (labels == aug_labels).all(), f"the two models' {split} predictions are not of the same pairs"
    fixed = None if m["task"] == "regression" else (thresholds["gold_only"], thresholds["augsbert"])
    return paired_bootstrap(m["task"], gold_pred, aug_pred, labels, seed=seed, thresholds=fixed)


def test_gain(m: dict, seed: int) -> dict:
    """``split_gain`` on test."""
    return split_gain(m, seed, "test")


def outcome(predicted: bool | None, delta: float) -> str:
    """right / wrong for a prediction of the sign of ``delta``; abstained for no prediction."""
    if predicted is None:
        return "abstained"
    return "right" if predicted == (delta > 0) else "wrong"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", nargs="+", default=["jobs/stsb-1k-student2.yaml", "jobs/mrpc-bm25.yaml"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="the bi-encoder's seeds (bi_encoder.seed)")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--root", type=Path, default=Path("runs/pilot-check"))
    p.add_argument("--out", default="benchmarks/results/pilot_check")
    args = p.parse_args(argv)

    from augsbert_ray.config import load_job
    from augsbert_ray.pipeline import run_job
    from provenance import provenance, write_result

    rows, raw = [], {}
    for job in args.jobs:
        for seed in args.seeds:
            overrides = [*args.extra, "evaluation.pilot=true", f"bi_encoder.seed={seed}",
                         f"run_dir={args.root / Path(job).stem}"]
            t0 = time.perf_counter()
            m = run_job(load_job(job, overrides)).to_dict()
            wall = time.perf_counter() - t0
            metric, pilot = m["primary_metric"], m["pilot"]
            gold, aug = m["scores"]["gold_only"]["test"][metric], m["scores"]["augsbert"]["test"][metric]
            gain = pilot["gain"] or {}
            row = {"job": Path(job).stem, "seed": seed, "metric": metric, "fraction": pilot["fraction"],
                   "scored_on": pilot.get("scored_on", "dev"),
                   "pilot_gold_dev": pilot["gold_only_dev"], "pilot_silver_dev": pilot["augsbert_dev"],
                   "gain": gain, "verdict": pilot["verdict"], "predicts_helps": pilot["predicts_silver_helps"],
                   "dev_pairs": m["data"].get("dev"), "gold_only_test": gold, "augsbert_test": aug,
                   "test_delta": aug - gold, "test_gain": test_gain(m, seed),
                   "outcome": outcome(pilot["predicts_silver_helps"], aug - gold),
                   "shipped": m["shipped"]["shipped"], "pilot_seconds": m["stage_seconds"].get("pilot"),
                   "run_seconds": sum(m["stage_seconds"].values()), "wall_s": wall}
            rows.append(row)
            raw[f"{row['job']} seed {seed}"] = m
            print(json.dumps(row, default=str), flush=True)
    fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    lines = ["# The pilot's verdict against the end result", "",
             "Pilots: the student after a fraction of its steps on gold alone and on gold + silver, scored on dev "
             "(or on folds of the gold training pairs, each predicted by pilots trained without it); "
             "the interval is the paired bootstrap's for the gain (gold + silver - gold only). Test: both "
             "bi-encoders trained to the end, the difference with the same bootstrap's interval on test. "
             "Scores x100.", "",
             "| job | seed | pilots scored on | pilot: gold only / gold + silver | gain (interval) | verdict | "
             "test: gold only / AugSBERT | test difference (interval) | outcome | pilot, s | run, s |",
             "|---|---:|---|---|---|---|---|---|---|---:|---:|"]
    span = lambda g: f"{g['difference']:+.2f} ({g['low']:+.2f} to {g['high']:+.2f})" if g else "n/a"  # noqa: E731
    for r in rows:
        verdict = {True: "helps", False: "does not help", None: "no prediction"}[r["predicts_helps"]]
        lines.append(f"| {r['job']} | {r['seed']} | {r['scored_on']} | {fmt(r['pilot_gold_dev'])} / "
                     f"{fmt(r['pilot_silver_dev'])} | "
                     f"{span(r['gain'])} | {verdict} | {r['gold_only_test']:.2f} / {r['augsbert_test']:.2f} | "
                     f"{span(r['test_gain'])} | {r['outcome']} | {r['pilot_seconds'] or 0:.0f} | "
                     f"{r['run_seconds']:.0f} |")
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("right", "wrong", "abstained")}
    confidence = next((r["gain"]["confidence"] for r in rows if r["gain"]), None)
    clear = [r for r in rows if r["test_gain"]["low"] > 0 or r["test_gain"]["high"] < 0]
    lines += ["", f"Over {len(rows)} runs the pilot was right {counts['right']} times, wrong {counts['wrong']} "
              f"times, and made no prediction {counts['abstained']} times"
              + (f" ({confidence:.0%} intervals)" if confidence else "") + f". On test, the 90% interval of "
              f"{len(clear)} of the {len(rows)} differences excludes 0 (the test set tells those from chance); "
              f"the pilot made no prediction on {sum(r['outcome'] == 'abstained' for r in clear)} of those.", "",
              *provenance("benchmarks/pilot_check.py", argv)]
    write_result(args.out, lines, {"rows": rows, "runs": raw})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
