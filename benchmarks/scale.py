"""Scale: candidate pairs generated and streamed into labelling as the corpus grows, and
throughput as Ray workers are added.

Each run is one corpus-mode job (``target.corpus``) driven through its stages up to the
silver labels: the cross-encoder trains on a small gold set, the corpus is read by Ray Data,
BM25 top-k picks the candidate pairs (queries sharded over searcher actors), and the actor
pool labels every pair, streaming from ``candidates.parquet`` into ``silver.parquet``. The
bi-encoder is not trained (its cost does not depend on how the pairs were made).

Memory is sampled four times a second while the job runs, in a fresh process per run: the
driver's resident set (RSS), and the proportional set size (PSS, shared pages split between
the processes that map them, so Ray's shared-memory object store is counted once) summed
over the driver and every process it started (Ray's GCS, raylet, workers and actors).

The corpus is synthetic, with realistic sentence lengths and words: sentence lengths in words
and words themselves are drawn from the STS benchmark's sentences (their length distribution
and unigram frequencies), so BM25's posting lists look like real text's. The cross-encoder is
by default a small random BERT on the embedded model's tokenizer (2 layers, hidden size 128)
so that a million pairs can be labelled on a 2-core machine within minutes; memory and the
pipeline's behaviour do not depend on what the scores are. ``--model embedded`` labels with
the embedded MiniLM instead (on 2 CPU cores about 190 pairs/s in fp32 and about 600 through
the pipeline in bf16, where the CPU has bf16 instructions: a million pairs in half an hour).

    python benchmarks/scale.py                                  # 10k, 100k and 1M pairs; 1 and 2 workers
    python benchmarks/scale.py --scales 1 10 --workers 1        # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


# -- a synthetic corpus with STSb's sentence lengths and words ------------------------------
def stsb_sentences(data_dir: Path) -> list[str]:
    from augsbert_ray.bench.data import unique_sentences

    return unique_sentences(data_dir)


def write_corpus(path: Path, n: int, data_dir: Path, seed: int = 0) -> dict:
    """``n`` distinct sentences, one per line, drawn word by word from STSb's statistics."""
    import re

    real = stsb_sentences(data_dir)
    words = [re.findall(r"\S+", s) for s in real]
    lengths = np.array([len(w) for w in words if w])
    vocab, counts = np.unique(np.concatenate([np.array(w, dtype=object) for w in words if w]), return_counts=True)
    rng = np.random.default_rng(seed)
    p = counts / counts.sum()
    seen: set[str] = set()
    chars = 0
    with open(path, "w", encoding="utf-8") as f:
        while len(seen) < n:
            m = min(n - len(seen), 50_000)
            lens = rng.choice(lengths, size=m)
            picks = rng.choice(len(vocab), size=int(lens.sum()), p=p)
            start = 0
            for k in lens:
                text = " ".join(vocab[picks[start:start + k]])
                start += k
                if text not in seen:
                    seen.add(text)
                    chars += len(text)
                    f.write(text + "\n")
    return {"sentences": n, "bytes": path.stat().st_size, "mean_chars": chars / n,
            "mean_words_stsb": float(lengths.mean())}


# -- one run (in its own process) -----------------------------------------------------------
def corpus_job_tree(name: str, work: Path, data: Path, corpus: str, model: str, cpus: int, sampling: dict) -> dict:
    """The corpus-mode job the scale benchmarks run, as a config tree: 64 STSb gold pairs, the
    lines of ``corpus`` as the target domain (MRPC's test set scores it), ``sampling`` for the
    candidates, ``model`` as the cross-encoder, one epoch each, run directory ``work/run``."""
    return {
        "name": name, "task": "regression", "seed": 1, "run_dir": str(work / "run"),
        "data": {"train": {"format": "stsb", "path": str(data / "stsb" / "sts-train.csv")},
                 "dev": {"format": "stsb", "path": str(data / "stsb" / "sts-dev.csv")},
                 "test": {"format": "stsb", "path": str(data / "stsb" / "sts-test.csv")},
                 "subsample": {"train": 64, "dev": 32, "test": 32}},
        "target": {"task": "binary", "corpus": {"path": corpus, "format": "lines"},
                   "test": {"format": "mrpc", "path": str(data / "mrpc" / "msr_paraphrase_test.txt")}},
        "sampling": sampling,
        "cross_encoder": {"model": model, "epochs": 1, "batch_size": 16},
        "bi_encoder": {"model": "embedded", "epochs": 1},
        "ray": {"num_cpus": cpus},
    }


def one_run(args) -> dict:
    from augsbert_ray.config import validate_tree
    from augsbert_ray.pipeline import run_job
    from augsbert_ray.progress.messages import lines_to

    work = Path(args.work)
    data = Path(args.data_dir)
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    workers = args.workers[0]
    from augsbert_ray.bench.model_dirs import tiny_cross_encoder

    model = args.model if args.model != "tiny" else tiny_cross_encoder(work / "tiny-ce")
    tree = corpus_job_tree("scale", work, data, args.corpus, model, args.cpus,
                           {"strategy": "bm25", "top_k": args.k, "searchers": workers})
    tree["labeling"] = {"actors": workers}
    cfg = validate_tree(tree)
    out: dict = {"pairs_target": args.pairs, "workers": workers, "model": args.model}
    from augsbert_ray.bench.memory import MemorySampler

    with MemorySampler() as mem:
        mem.stage = "setup"

        def on_start(stage: str) -> None:  # the sampler attributes memory to the running stage
            mem.stage = {"candidates": "candidates", "silver": "labelling"}.get(stage, "setup")

        with lines_to(log):
            m = run_job(cfg, fresh=True, until="silver", on_start=on_start)
        mem.stage = "end"
    c, s = m.stage("candidates"), m.stage("silver")
    out.update(candidates_s=c.seconds, labelling_s=s.seconds)
    out.update(sentences=c.result.sentences, candidates=c.result.candidates, silver=s.result.silver,
               queries_per_s=c.result.sentences / out["candidates_s"], pairs_per_s=s.result.pairs_per_s,
               peak_driver_rss=mem.peak_rss, peak_total_pss=mem.peak_total, stages=mem.stage_peaks)
    return out


# -- the benchmark ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-pairs", type=int, default=10_000, help="candidate pairs at scale 1")
    p.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                   help="BM25 searchers and labelling actors (the scaling runs use the middle scale)")
    p.add_argument("--k", type=int, default=5, help="BM25 top-k per sentence")
    p.add_argument("--model", default="tiny", help="tiny (a small random BERT), embedded, or a model path")
    p.add_argument("--cpus", type=int, default=os.cpu_count())
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--out", default="benchmarks/results/scale")
    p.add_argument("--keep", help="keep run directories under this folder (default: a temporary folder)")
    # one run, in a child process
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--pairs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        Path(args.result).write_text(json.dumps(one_run(args)))
        return 0

    from provenance import provenance, write_result

    root = Path(args.keep or tempfile.mkdtemp(prefix="augsbert-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    # BM25 top-k gives k pairs per sentence less the pairs found from both ends (about 0.67 k
    # on this corpus).
    plan = [(scale, args.workers[-1]) for scale in args.scales]
    mid = sorted(args.scales)[len(args.scales) // 2]
    plan += [(mid, w) for w in args.workers if (mid, w) not in plan]
    runs = []
    for scale, workers in plan:
        pairs = args.base_pairs * scale
        sentences = int(pairs / (args.k * 0.65)) + 1
        work = root / f"x{scale}-w{workers}"
        work.mkdir(parents=True, exist_ok=True)
        corpus_path = root / f"corpus-{sentences}.txt"
        if not corpus_path.exists():
            print(f"[scale] writing a synthetic corpus of {sentences} sentences", flush=True)
            info = write_corpus(corpus_path, sentences, Path(args.data_dir))
            (root / f"corpus-{sentences}.json").write_text(json.dumps(info))
        info = json.loads((root / f"corpus-{sentences}.json").read_text())
        print(f"[scale] x{scale}: {sentences} sentences, {workers} worker(s)", flush=True)
        result = work / "result.json"
        cmd = [sys.executable, __file__, "--one", "--corpus", str(corpus_path), "--work", str(work),
               "--pairs", str(pairs), "--result", str(result), "--k", str(args.k), "--model", args.model,
               "--cpus", str(args.cpus), "--data-dir", args.data_dir, "--workers", str(workers)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        r = json.loads(result.read_text())
        r.update(scale=scale, wall_s=time.perf_counter() - t0, corpus=info)
        runs.append(r)
        print(f"[scale] x{scale} w{workers}: {r['candidates']} pairs, driver peak {r['peak_driver_rss'] / 2**20:.0f} "
              f"MiB, total peak {r['peak_total_pss'] / 2**20:.0f} MiB", flush=True)

    mib = 2 ** 20
    by_scale = {r["scale"]: r for r in runs if r["workers"] == args.workers[-1]}
    base = by_scale[min(by_scale)]
    lines = ["# Scale: candidates streamed into labelling as the corpus grows", "",
             f"One corpus-mode job per row, up to the silver labels (BM25 top-{args.k}; cross-encoder: {args.model}"
             + (", a random 2-layer BERT with hidden size 128 on the embedded tokenizer" if args.model == "tiny" else
                ", MiniLM-L6 at full size, trained for one epoch on 64 gold pairs: a real model's speed, not its scores"
                if args.model == "embedded" else "")
             + f"; {args.cpus} CPUs). Synthetic corpus: STSb's sentence lengths and word frequencies "
             f"(mean {base['corpus']['mean_chars']:.0f} characters). Peak memory sampled every 0.25 s: the driver's "
             "RSS, and PSS summed over the driver and every Ray process it started.", "",
             "| scale | sentences | candidate pairs | labelled | candidates: sentences/s | labelled pairs/s | peak driver RSS "
             f"(MiB) | peak total PSS (MiB) | total vs {min(by_scale)}x |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for scale in sorted(by_scale):
        r = by_scale[scale]
        lines.append(f"| {scale}x | {r['sentences']:,} | {r['candidates']:,} | {r['silver']:,} | "
                     f"{r['queries_per_s']:,.0f} | {r['pairs_per_s']:,.0f} | {r['peak_driver_rss'] / mib:,.0f} | "
                     f"{r['peak_total_pss'] / mib:,.0f} | {r['peak_total_pss'] / base['peak_total_pss']:.2f}x |")
    lines += ["", "Peak memory by stage (MiB, driver RSS / total PSS):", "",
              "| scale | setup and teacher | candidates | labelling |", "|---:|---:|---:|---:|"]
    for scale in sorted(by_scale):
        st = by_scale[scale]["stages"]
        cell = lambda k: f"{st[k]['driver_rss'] / mib:,.0f} / {st[k]['total_pss'] / mib:,.0f}" if k in st else "-"
        lines.append(f"| {scale}x | {cell('setup')} | {cell('candidates')} | {cell('labelling')} |")
    scaling = [r for r in runs if r["scale"] == mid]
    if len({r["workers"] for r in scaling}) > 1:
        lines += ["", f"Workers (scale {mid}x; searcher actors for BM25, labelling actors; each with "
                      f"{args.cpus}/workers CPUs):", "",
                  "| workers | candidates: sentences/s | labelled pairs/s | candidates s | labelling s |", "|---:|---:|---:|---:|---:|"]
        for r in sorted(scaling, key=lambda r: r["workers"]):
            lines.append(f"| {r['workers']} | {r['queries_per_s']:,.0f} | {r['pairs_per_s']:,.0f} | "
                         f"{r['candidates_s']:.1f} | {r['labelling_s']:.1f} |")
    lines += ["", *provenance("benchmarks/scale.py", argv)]
    write_result(args.out, lines, {"runs": runs, "args": vars(args)})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
