"""The autopilot against a user's single default run: what is shipped, how much of the gap to
the teacher it closes, whether the pilots predicted right, and what it cost.

For each job and seed: the job as written (the user's default run), then the job with
``auto.enabled`` (its grid from ``--set auto.*`` overrides), both in one run directory per
job, so the autopilot reuses what the default run made and vice versa. Per run: the gold-only,
teacher, AugSBERT and shipped models' test scores, the share of the gap between gold only and
the job's own teacher that the shipped model closes, and wall time. With ``--audit`` every
setting the autopilot tried is also trained to the end, so its pilot's prediction (silver
helps or not, on dev) can be checked against the end result on test.

    python benchmarks/autopilot_quality.py --jobs jobs/stsb-1k-student2.yaml --seeds 1 2
    python benchmarks/autopilot_quality.py --jobs jobs/mrpc-bm25.yaml --set bi_encoder.num_layers=2 \\
        --set auto.top_k=[3] --default-pilot --audit
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def run(job: str, overrides: list[str], log_dir: Path) -> tuple[dict, float]:
    from augsbert_ray.config import load_job
    from augsbert_ray.pipeline import run_job

    t0 = time.perf_counter()
    m = run_job(load_job(job, overrides))
    return m.to_dict(), time.perf_counter() - t0


def setting_label(job: str, overrides: list[str]) -> str:
    """The job's own setting, named as the autopilot names the settings it tries."""
    from augsbert_ray.config import load_job
    from augsbert_ray.stages.auto import job_setting

    return job_setting(load_job(job, overrides)).label


def single_run_seconds(m: dict) -> float:
    """What the run's stages took when they were first run (reused stages keep their time)."""
    return float(sum(m["stage_seconds"].values()))


def gap_closed(m: dict, model: str) -> float | None:
    metric = m["primary_metric"]
    gold, teacher = m["scores"]["gold_only"]["test"][metric], m["scores"]["cross_encoder"]["test"][metric]
    got = m["scores"][model]["test"][metric]
    return None if teacher == gold else (got - gold) / (teacher - gold)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", nargs="+", default=["jobs/stsb-1k-student2.yaml"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="the bi-encoder's seeds (bi_encoder.seed)")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--audit", action="store_true", help="also train every setting tried to the end")
    p.add_argument("--default-pilot", action="store_true",
                   help="run the default run with evaluation.pilot, so its pilot's prediction is checked too")
    p.add_argument("--root", type=Path, default=Path("runs/autopilot-quality"))
    p.add_argument("--out", default="benchmarks/results/autopilot_quality")
    args = p.parse_args(argv)

    from provenance import provenance, write_result

    rows, raw = [], {}
    for job in args.jobs:
        for seed in args.seeds:
            run_dir = args.root / Path(job).stem
            base = [*args.extra, f"bi_encoder.seed={seed}", f"run_dir={run_dir}"]
            default, default_wall = run(job, base + (["evaluation.pilot=true"] if args.default_pilot else []), run_dir)
            auto, auto_wall = run(job, base + ["auto.enabled=true"], run_dir)
            metric = auto["primary_metric"]
            shipped = auto["shipped"]["shipped"]
            audit = []
            if args.audit:
                for setting in auto["auto"]["settings"]:
                    if setting.get("pilot_dev") is None:
                        continue
                    over = [f"{k}={json.dumps(v) if isinstance(v, str) and not v.isidentifier() else v}"
                            for k, v in setting["overrides"].items()]
                    m, _ = run(job, base + over, run_dir)
                    delta = m["scores"]["augsbert"]["test"][metric] - m["scores"]["gold_only"]["test"][metric]
                    predicted = setting["pilot_dev"] > auto["auto"]["gold_only_pilot_dev"]
                    audit.append({"setting": setting["setting"], "pilot_dev": setting["pilot_dev"],
                                  "test_delta": delta, "predicted_helps": predicted, "right": predicted == (delta > 0)})
            row = {
                "job": Path(job).stem, "seed": seed, "metric": metric,
                "gold_only": auto["scores"]["gold_only"]["test"][metric],
                "teacher_default": default["scores"]["cross_encoder"]["test"][metric],
                "augsbert_default": default["scores"]["augsbert"]["test"][metric],
                "teacher_auto": auto["scores"]["cross_encoder"]["test"][metric],
                "augsbert_auto": auto["scores"]["augsbert"]["test"][metric],
                "shipped": shipped,
                "shipped_test": auto["scores"][shipped]["test"][metric],
                "gap_closed_default": gap_closed(default, "augsbert"),
                "gap_closed_shipped": gap_closed(auto, shipped),
                "chosen": auto["auto"]["chosen"], "pilot_fraction": auto["auto"]["pilot_fraction"],
                "pilot_predicts_helps": auto["auto"]["predicts_silver_helps"],
                "augsbert_beats_gold_on_test": auto["scores"]["augsbert"]["test"][metric]
                > auto["scores"]["gold_only"]["test"][metric],
                "default_setting": setting_label(job, base),
                "default_pilot_predicts_helps": (default.get("pilot") or {}).get("predicts_silver_helps"),
                "default_beats_gold_on_test": default["scores"]["augsbert"]["test"][metric]
                > default["scores"]["gold_only"]["test"][metric],
                "default_run_s": single_run_seconds(default), "auto_run_s": single_run_seconds(auto),
                "auto_wall_s": auto_wall, "default_wall_s": default_wall, "audit": audit,
            }
            rows.append(row)
            raw[f"{row['job']} seed {seed}"] = {"default": default, "auto": auto}
            print(json.dumps(row, indent=1, default=str), flush=True)
    lines = ["# The autopilot against a single default run", "",
             "Test scores x100; the gap is the job's own teacher minus gold only on test; the shipped model "
             "is the better of AugSBERT and gold only on dev.", "",
             "| job | seed | gold only | default: teacher / AugSBERT (gap closed) | autopilot: teacher / AugSBERT | "
             "shipped (gap closed) | chosen setting | pilot said silver helps / did it on test | "
             "default run, s | autopilot run, s |",
             "|---|---:|---:|---|---|---|---|---|---:|---:|"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['job']} | {r['seed']} | {r['gold_only']:.2f} | {r['teacher_default']:.2f} / "
                     f"{r['augsbert_default']:.2f} ({pct(r['gap_closed_default'])}) | {r['teacher_auto']:.2f} / "
                     f"{r['augsbert_auto']:.2f} | {r['shipped']} {r['shipped_test']:.2f} "
                     f"({pct(r['gap_closed_shipped'])}) | {r['chosen']} | {r['pilot_predicts_helps']} / "
                     f"{r['augsbert_beats_gold_on_test']} | {r['default_run_s']:.0f} | {r['auto_run_s']:.0f} |")
    for job in dict.fromkeys(r["job"] for r in rows):
        rs = [r for r in rows if r["job"] == job]
        closed = [r["gap_closed_shipped"] for r in rs if r["gap_closed_shipped"] is not None]
        lines += ["", f"{job}: shipped model closes {pct(float(np.mean(closed)) if closed else None)} of the gap on "
                  f"average over {len(rs)} seed(s); never below gold only on test: "
                  f"{all(r['shipped_test'] >= r['gold_only'] for r in rs)}; the autopilot run took "
                  f"{np.mean([r['auto_run_s'] for r in rs]) / np.mean([r['default_run_s'] for r in rs]):.1f}x a "
                  "default run's stage time."]
    checks = [(r["pilot_predicts_helps"], r["augsbert_beats_gold_on_test"]) for r in rows
              if r["pilot_predicts_helps"] is not None]
    checks += [(r["default_pilot_predicts_helps"], r["default_beats_gold_on_test"]) for r in rows
               if r["default_pilot_predicts_helps"] is not None
               and r["default_setting"] != r["chosen"]]  # the same setting and pilot: counted once
    checks += [(a["predicted_helps"], a["test_delta"] > 0) for r in rows for a in r["audit"]
               if a["setting"] != r["chosen"]]  # the chosen one is counted above
    if checks:
        lines += ["", f"The pilots (gold + silver against gold alone, on dev, after {rows[0]['pilot_fraction']:.0%} of "
                  f"the steps) predicted whether AugSBERT beats gold only on test for "
                  f"{sum(p == t for p, t in checks)} of {len(checks)} settings trained to the end "
                  "(the autopilot's choice per run" + (", the default run's setting" if args.default_pilot else "")
                  + (", and every audited setting" if args.audit else "") + ")."]
        if args.default_pilot:
            lines += ["", "| job | seed | default run: pilot said helps / AugSBERT beat gold on test |", "|---|---:|---|"]
            lines += [f"| {r['job']} | {r['seed']} | {r['default_pilot_predicts_helps']} / "
                      f"{r['default_beats_gold_on_test']} |" for r in rows]
    audits = [a for r in rows for a in r["audit"]]
    if audits:
        lines += ["", f"Audit: the pilots predicted the sign of AugSBERT - gold only on test for "
                  f"{sum(a['right'] for a in audits)} of {len(audits)} settings trained to the end.", "",
                  "| job | seed | setting | pilot dev | test: AugSBERT - gold only | pilot said helps | right |",
                  "|---|---:|---|---:|---:|---|---|"]
        for r in rows:
            lines += [f"| {r['job']} | {r['seed']} | {a['setting']} | {a['pilot_dev']:.2f} | {a['test_delta']:+.2f} | "
                      f"{a['predicted_helps']} | {a['right']} |" for a in r["audit"]]
    lines += ["", *provenance("benchmarks/autopilot_quality.py", argv)]
    write_result(args.out, lines, {"rows": rows, "runs": raw})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
