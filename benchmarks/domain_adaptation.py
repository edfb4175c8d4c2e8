"""Domain adaptation in the form of the paper's Table 6: several source -> target transfers,
each model scored on the target's labelled test set, one column per transfer.

Each transfer is one domain-adaptation job (a job file with a ``target:`` section), run end to
end with ``run_job``: the cross-encoder trains on the source gold and labels the target pairs
(or pairs it samples from a target corpus), and the table gathers what every job reports on
the target test set: the upper bound (bi-encoder on target gold, where the target has labels),
AugSBERT (bi-encoder on target silver), the lower bound (bi-encoder on source gold), the
zero-shot bi-encoder, and the teacher itself. Scores are x100: Spearman for regression
targets, AUC(0.05) (Shah et al. 2018's normalisation, as the paper) for binary ones.

    python benchmarks/domain_adaptation.py                         # every jobs/da-*.yaml
    python benchmarks/domain_adaptation.py --jobs jobs/da-stsb-to-mrpc.yaml --set bi_encoder.num_layers=2

All jobs run in one run directory under ``--root``, so stages with the same declared inputs
and settings are done once: jobs with the same source share their teacher and lower bound,
and a re-run reuses what an earlier one finished.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_JOBS = ["jobs/da-stsb-to-mrpc.yaml", "jobs/da-stsb-to-mrpc-corpus.yaml",
                "jobs/da-stsb-captions-to-news.yaml", "jobs/da-stsb-news-to-forums.yaml",
                "jobs/da-stsb-forums-to-captions.yaml"]
ROWS = [("target_gold", "Upper bound: target gold"),
        ("augsbert", "AugSBERT: target silver"),
        ("gold_only", "Lower bound: source gold"),
        ("zero_shot", "Zero-shot bi-encoder"),
        ("cross_encoder", "Cross-encoder (teacher, source gold)")]


def run_transfer(job: str, extra: list[str], root: Path) -> dict:
    from augsbert_ray.config import load_job
    from augsbert_ray.pipeline import run_job

    return run_job(load_job(job, extra + [f"run_dir={root / 'shared'}"])).to_dict()


def transfer_name(metrics: dict) -> str:
    return metrics["job"].removeprefix("da-")


def table(runs: dict[str, dict]) -> list[str]:
    names = list(runs)
    metrics = {n: runs[n]["target"]["metric"] for n in names}
    label = {"spearman": "Spearman", "auc_0.05": "AUC(0.05)"}
    lines = ["| model | " + " | ".join(f"{transfer_name(runs[n])} ({label.get(metrics[n], metrics[n])})" for n in names)
             + " |", "|---|" + "---:|" * len(names)]
    for key, title in ROWS:
        cells = []
        for n in names:
            s = runs[n]["scores"].get(key, {}).get("target_test")
            cells.append(f"{s[metrics[n]]:.2f}" if s else "n/a")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    gain = []
    for n in names:
        s = runs[n]["scores"]
        gain.append(f"{s['augsbert']['target_test'][metrics[n]] - s['gold_only']['target_test'][metrics[n]]:+.2f}")
    lines.append("| AugSBERT - lower bound | " + " | ".join(gain) + " |")
    lines += ["", "| transfer | source gold pairs | target silver pairs | target test pairs | silver label mean | "
              "teacher - lower bound, source dev | stages run, s | stages reused |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for n in names:
        m = runs[n]
        data = m["target"]["data"]
        own = sum(v for k, v in m["stage_seconds"].items() if k not in m["stages_reused"])
        lines.append(f"| {transfer_name(m)} | {m['data']['train']} | {m['sampling']['silver']} | {data['test']['pairs']} | "
                     f"{m['sampling']['silver_label_mean']:.3f} | {m['teacher_check']['gap']:+.2f} | {own:.0f} | "
                     f"{', '.join(m['stages_reused']) or '-'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", nargs="+", default=DEFAULT_JOBS)
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--root", type=Path, default=Path("runs/domain-adaptation"))
    p.add_argument("--out", default="benchmarks/results/domain_adaptation")
    args = p.parse_args(argv)

    from provenance import provenance, write_result

    runs: dict[str, dict] = {}
    for job in args.jobs:
        runs[job] = run_transfer(job, args.extra, args.root)
    lines = ["# Domain adaptation (Table 6 form)", "",
             "Every figure is x100 on the target's labelled test set; n/a: the target has no labels to train "
             "an upper bound (a corpus). Jobs: " + ", ".join(f"`{j}`" for j in args.jobs)
             + (f"; overrides `{' '.join(args.extra)}`." if args.extra else "."), "",
             *table(runs), "", *provenance("benchmarks/domain_adaptation.py", argv)]
    write_result(args.out, lines, {"runs": runs, "args": {k: str(v) for k, v in vars(args).items()}})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
