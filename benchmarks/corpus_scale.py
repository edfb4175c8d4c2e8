"""Large corpora end to end: a domain-adaptation job over 100k, 300k and 1M corpus sentences,
with the wall time of every stage and peak memory, to see whether memory stays flat as the
corpus grows.

Each size is one corpus-mode job (``target.corpus``, format ``lines``) run in a fresh process up
to the silver labels: gold loading, the teacher trained on a small STSb gold set, the checks
beside it, the corpus read and deduplicated by Ray Data, candidate pairs sampled over the
corpus sentences, and every candidate labelled by the actor pool. The bi-encoder is not
trained on the silver set (its cost does not depend on where the pairs came from).

The corpus is generated, never copied into the repository: ``scale.write_corpus`` draws each
sentence word by word from the STS benchmark's sentences in ``--data-dir`` (their length
distribution and unigram frequencies, seeded, distinct sentences only) and writes one per line
under ``--work``. The default sampler is random recombination with one partner per sentence
(``rs``, so the labelling budget is about one pair per sentence) and the cross-encoder a
random 2-layer BERT (hidden size 128) on the embedded tokenizer: the point is the engine's
memory and time per stage, not the scores. ``--strategy bm25`` runs BM25 top-k instead,
``ss`` semantic search and ``bm25+ss`` both, with the job's bi-encoder (the embedded MiniLM,
384 floats a sentence); by default the gold-only student embeds (``sampling.ss_model:
gold_only``, trained first on the 64 gold pairs), ``--set sampling.ss_model=zero_shot`` the
untrained model.

A corpus above 4 MiB has its candidates made on shards (``--candidates sharded``, the engine's
path for text corpora) or in one task on the driver's node (``single``, the path before);
``--candidates sharded single`` runs each size both ways, and the table of the largest single
processes sets them side by side.

Memory is sampled four times a second (``augsbert_ray.bench.memory.MemorySampler``): the
driver's RSS, and PSS summed over the driver and every process it started (Ray's GCS,
raylet, workers and actors), so Ray's shared-memory object store is counted once.

    nice python benchmarks/corpus_scale.py --work /tmp/corpus-scale             # 100k, 300k, 1M
    python benchmarks/corpus_scale.py --sizes 20000 --work /tmp/cs --out /tmp/cs/result   # a quick look
    python benchmarks/corpus_scale.py --until candidates --work /tmp/cs --out /tmp/cs/candidates   # minutes
    python benchmarks/corpus_scale.py --sizes 100000 --set labeling.executor=pool --work /tmp/cs --out /tmp/cs/pool
    python benchmarks/corpus_scale.py --until candidates --sizes 1000000 3000000 --candidates sharded single \
        --work /tmp/cs --out /tmp/cs/distributed
    python benchmarks/corpus_scale.py --until candidates --strategy ss --k 3 --sizes 100000 300000 \
        --candidates sharded single --set sampling.ss_model=zero_shot --work /tmp/cs --out /tmp/cs/ss
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MIB = 2 ** 20


def one_run(args) -> dict:
    """One job over one corpus, in this process; its stage times and memory peaks."""
    from augsbert_ray.bench.memory import MemorySampler
    from augsbert_ray.bench.model_dirs import tiny_cross_encoder
    from augsbert_ray.config import validate_tree
    from augsbert_ray.config.loading import apply_overrides
    from augsbert_ray.progress.messages import lines_to
    from augsbert_ray.pipeline import run_job
    from scale import corpus_job_tree

    from augsbert_ray.candidates import sharded

    sharded.ENABLED = args.candidates[0] == "sharded"
    work, data = Path(args.work), Path(args.data_dir)
    model = args.model if args.model != "tiny" else tiny_cross_encoder(work / "tiny-ce")
    sampling = ({"strategy": "rs", "random_per_sentence": args.k} if args.strategy == "rs"
                else {"strategy": args.strategy, "top_k": args.k})
    tree = corpus_job_tree("corpus-scale", work, data, args.corpus, model, args.cpus, sampling)
    cfg = validate_tree(apply_overrides(tree, args.set))
    with MemorySampler() as mem:
        mem.stage = "setup"

        def on_start(stage: str) -> None:  # memory is attributed to the stage that runs last started
            mem.stage = stage

        with lines_to(lambda line: print(line, flush=True)):
            m = run_job(cfg, fresh=True, until=args.until, on_start=on_start)
        mem.stage = "end"
    c = m.stage("candidates")
    silver = m.stage("silver").result.silver if args.until == "silver" else None
    return {"sentences": c.result.sentences, "candidates": c.result.candidates, "silver": silver,
            "stage_seconds": m.stage_seconds, "peak_driver_rss": mem.peak_rss, "peak_total_pss": mem.peak_total,
            "peak_driver_private": mem.peak_private, "peak_driver_shared": mem.peak_shared,
            "peak_total_anon": mem.peak_total_anon, "peak_total_shmem": mem.peak_total_shmem,
            "stage_peaks": mem.stage_peaks, "role_peaks": mem.role_peaks, "timeline": mem.timeline,
            "process_peaks": mem.process_peaks}


# Titles of the processes that read a corpus and sample its candidates: the sharded path's Ray Data
# tasks and actors, the single-task path's task and its Ray Data tasks; both paths' driver-node tasks.
CANDIDATE_WORK = ("_read_range", "_dedup_shard", "_number_range", "_draw", "_Search",
                  "_pair_bucket", "_in_task", "read_ranges", "draw_batch", "BM25Searcher", "_EmbedBlocks",
                  "_build_shard", "_search_block", "SentenceEmbedder", "_IndexShard")


def _largest(run: dict, candidates_only: bool) -> tuple[str, int, int]:
    """The title, peak PSS and peak anonymous PSS of the largest single process of a run (by PSS)."""
    peaks = {t: p for t, p in run.get("process_peaks", {}).items()
             if not candidates_only or any(w in t for w in CANDIDATE_WORK)}
    if not peaks:
        return "-", 0, 0
    title = max(peaks, key=lambda t: peaks[t][0])
    return title, *peaks[title]


def _label(run: dict) -> str:
    """A run's row name: its corpus lines, and how its candidates were made."""
    return f"{run['size']:,} ({run.get('candidates_path', 'single')})"


def _mib(value) -> str:
    """MiB, or "-" where a run (of an older version of this script) did not record it."""
    return "-" if value is None else f"{value / MIB:,.0f}"


def _count(value) -> str:
    """A count, or "-" where the run stopped before it (``--until candidates``)."""
    return "-" if value is None else f"{value:,}"


def _markdown(runs: list[dict], args, argv) -> list[str]:
    from provenance import provenance

    from augsbert_ray.bench.hardware import cpu_description

    base = runs[0]
    what = (f"random recombination, {args.k} partner(s) per sentence" if args.strategy == "rs"
            else f"{args.strategy} top-{args.k}")
    last = "the silver labels" if args.until == "silver" else "the candidate pairs (`--until candidates`)"
    lines = ["# Large corpora end to end: stage times and peak memory against corpus size", "",
             f"One domain-adaptation job (corpus mode) per row, up to {last}; candidates: {what}; "
             f"cross-encoder: {args.model}" + (" (a random 2-layer BERT, hidden size 128, embedded tokenizer)"
                                                if args.model == "tiny" else "")
             + (f"; settings: {', '.join(f'`{kv}`' for kv in args.set)}" if args.set else "")
             + f"; gold: 64 STSb pairs; {args.cpus} CPUs. Corpus: distinct sentences drawn word by word from the "
             "STS benchmark's length distribution and word frequencies (`scale.write_corpus`, seeded), one per "
             "line. Peak memory sampled every 0.25 s: the driver's RSS, split into its private memory and the "
             "shared memory it maps (pages of Ray's object store it has read: counted once in the total, and "
             "bounded by the store's size), and PSS summed over the driver and every Ray process it started, with "
             "that sum's anonymous part (the processes' own heaps) and its shared-memory part (Ray's object "
             "store, bounded by the store's size), each at its own peak.", "",
             "| corpus lines | sentences | candidate pairs | labelled | job wall (s) | candidates (s) | labelling (s) "
             "| peak driver RSS (MiB) | peak driver private (MiB) | peak driver shared (MiB) | peak total PSS (MiB) "
             "| total vs smallest | peak total anonymous (MiB) | peak total shared memory (MiB) "
             "| load average (1 min) start / end | ended |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        st = r["stage_seconds"]
        lines.append(f"| {_label(r)} | {r['sentences']:,} | {r['candidates']:,} | {_count(r['silver'])} | "
                     f"{r['wall_s']:.0f} | {st.get('candidates', 0):.0f} | {st.get('silver', 0):.0f} | "
                     f"{r['peak_driver_rss'] / MIB:,.0f} | {_mib(r.get('peak_driver_private'))} | "
                     f"{_mib(r.get('peak_driver_shared'))} | {r['peak_total_pss'] / MIB:,.0f} | "
                     f"{r['peak_total_pss'] / base['peak_total_pss']:.2f}x | "
                     f"{_mib(r.get('peak_total_anon'))} | {_mib(r.get('peak_total_shmem'))} | "
                     f"{r['load_start'][0]:.1f} / {r['load_end'][0]:.1f} | {r.get('measured', '-')} |")
    stages = list(dict.fromkeys(s for r in runs for s in r["stage_seconds"]))
    lines += ["", "Wall time of every stage (s; stages beside each other overlap):", "",
              "| corpus lines | " + " | ".join(stages) + " |", "|---:|" + "---:|" * len(stages)]
    for r in runs:
        lines.append(f"| {_label(r)} | " + " | ".join(f"{r['stage_seconds'].get(s, 0):.1f}" for s in stages) + " |")
    peaks = list(dict.fromkeys(s for r in runs for s in r["stage_peaks"]))
    lines += ["", "Peak memory while each stage was the last to start (MiB, driver RSS / driver private / total PSS / "
              "total shared memory):",
              "",
              "| corpus lines | " + " | ".join(peaks) + " |", "|---:|" + "---:|" * len(peaks)]
    for r in runs:
        p = r["stage_peaks"]
        lines.append(f"| {_label(r)} | " + " | ".join(
            f"{p[s]['driver_rss'] / MIB:,.0f} / {_mib(p[s].get('driver_private'))} / {p[s]['total_pss'] / MIB:,.0f} / "
            f"{_mib(p[s].get('total_shmem'))}"
            if s in p else "-" for s in peaks) + " |")
    lines += _largest_table(runs)
    lines += _role_table(runs)
    lines += ["", f"CPU: {cpu_description()}. The machine was shared with other jobs: the load average column "
                  "says how busy it was, so the times are not throughput figures.", "",
              *provenance("benchmarks/corpus_scale.py", argv)]
    return lines


def _largest_table(runs: list[dict]) -> list[str]:
    """The largest single process of each run: of the candidates' work, and of the whole job."""
    runs = [r for r in runs if r.get("process_peaks")]
    if not runs:
        return []
    base = {}
    lines = ["", "The largest single process (peak PSS of one process, its own anonymous part beside it; a Ray "
             "worker named by the task or actor it ran at its peak): among the processes that read the corpus and "
             "sample its candidates, and among all the job's processes (the driver included):", "",
             "| candidates path | corpus lines | candidates: largest process | its peak PSS (MiB) | its anonymous "
             "(MiB) | vs smallest corpus | driver RSS (MiB) | whole job: largest process | its peak PSS (MiB) |",
             "|---|---:|---|---:|---:|---:|---:|---|---:|"]
    for r in runs:
        path = r.get("candidates_path", "single")
        title, pss, anon = _largest(r, True)
        base.setdefault(path, pss)
        whole, whole_pss, _ = _largest(r, False)
        lines.append(f"| {path} | {r['size']:,} | `{title}` | {pss / MIB:,.0f} | {anon / MIB:,.0f} | "
                     f"{pss / base[path]:.2f}x | {r['peak_driver_rss'] / MIB:,.0f} | `{whole}` | "
                     f"{whole_pss / MIB:,.0f} |")
    return lines


def _role_table(runs: list[dict]) -> list[str]:
    """Each kind of process's own memory (anonymous PSS, summed over its processes) at its peak,
    and the labelling actors' growth: their memory when first sampled, and when it peaked."""
    from augsbert_ray.bench.memory import ROLES

    runs = [r for r in runs if r.get("role_peaks")]
    if not runs:
        return []
    lines = ["", "Own memory (anonymous PSS, MiB) of each kind of process at its peak, summed over its processes "
             "(sampled every 0.25 s; a process's kind from the title Ray gives it). Labelling actors: their memory "
             "in the first sample that saw them and at their peak, with the seconds since the job started:", "",
             "| corpus lines | " + " | ".join(ROLES) + " | labelling actors: first seen | labelling actors: peak |",
             "|---:|" + "---:|" * (len(ROLES) + 2)]
    for r in runs:
        actors = [(t, point["labelling actors"]) for t, point in r.get("timeline", []) if point["labelling actors"]]
        first = f"{actors[0][1] / MIB:,.0f} at {actors[0][0]:.0f} s" if actors else "-"
        peak = max(actors, key=lambda tp: tp[1], default=None)
        lines.append(f"| {_label(r)} | " + " | ".join(f"{r['role_peaks'].get(k, 0) / MIB:,.0f}" for k in ROLES)
                     + f" | {first} | " + (f"{peak[1] / MIB:,.0f} at {peak[0]:.0f} s" if peak else "-") + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000], help="corpus lines")
    p.add_argument("--strategy", default="rs", choices=["rs", "bm25", "ss", "bm25+ss"],
                   help="how candidates are sampled")
    p.add_argument("--k", type=int, default=1, help="partners (rs) or top-k (bm25, ss, bm25+ss) per sentence")
    p.add_argument("--model", default="tiny", help="tiny (a small random BERT), embedded, or a model path")
    p.add_argument("--cpus", type=int, default=os.cpu_count())
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--work", required=True, help="where the corpora and run directories go (not the repository)")
    p.add_argument("--out", default="benchmarks/results/corpus_scale_cpu")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a job setting for every size, as augsbert run takes it (e.g. labeling.executor=pool)")
    p.add_argument("--until", default="silver", choices=["silver", "candidates"],
                   help="the last stage run: the silver labels, or the candidate pairs alone (minutes, not an hour)")
    p.add_argument("--candidates", nargs="+", default=["sharded"], choices=["sharded", "single"],
                   help="how a large corpus's candidates are made: on sentence parts in Ray Data tasks (sharded), or "
                        "in one task on the driver's node (single, the path before); several: each, side by side")
    # one run, in a child process
    p.add_argument("--merge", action="store_true",
                   help="keep the sizes already in --out's JSON that this call does not run (each row is still "
                        "its own fresh run; the table gives every row's date and load)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        Path(args.result).write_text(json.dumps(one_run(args)))
        return 0

    from provenance import write_result
    from scale import write_corpus

    argv = sys.argv[1:] if argv is None else argv
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    runs = []
    earlier = Path(args.out).with_suffix(".json")
    if args.merge and earlier.exists():
        runs = [r for r in json.loads(earlier.read_text())["runs"]
                if (r["size"], r.get("candidates_path", "single")) not in
                {(size, path) for size in args.sizes for path in args.candidates}]
    for path, size in [(path, size) for path in args.candidates for size in sorted(args.sizes)]:
        corpus = root / f"corpus-{size}.txt"
        if not corpus.exists():
            print(f"[corpus-scale] writing a corpus of {size:,} sentences to {corpus}", flush=True)
            info = write_corpus(corpus, size, Path(args.data_dir))
            (root / f"corpus-{size}.json").write_text(json.dumps(info))
        work = root / f"run-{path}-{size}"
        work.mkdir(parents=True, exist_ok=True)
        result = work / "result.json"
        cmd = [sys.executable, __file__, "--one", "--corpus", str(corpus), "--work", str(work), "--result",
               str(result), "--strategy", args.strategy, "--k", str(args.k), "--model", args.model,
               "--cpus", str(args.cpus), "--data-dir", args.data_dir, "--until", args.until, "--candidates", path,
               *(f"--set={kv}" for kv in args.set)]
        load_start, t0 = os.getloadavg(), time.perf_counter()
        subprocess.run(cmd, check=True)
        r = json.loads(result.read_text())
        r.update(size=size, candidates_path=path, wall_s=time.perf_counter() - t0, load_start=load_start, load_end=os.getloadavg(),
                 measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 corpus=json.loads((root / f"corpus-{size}.json").read_text()))
        runs = sorted([*runs, r], key=lambda run: (run.get("candidates_path", "single"), run["size"]))
        print(f"[corpus-scale] {path} {size:,}: {r['candidates']:,} pairs ({_count(r['silver'])} labelled) in "
              f"{r['wall_s']:.0f} s, driver peak "
              f"{r['peak_driver_rss'] / MIB:,.0f} MiB, total peak {r['peak_total_pss'] / MIB:,.0f} MiB", flush=True)
        # written after every size, so a long last size leaves the others on record
        write_result(args.out, _markdown(runs, args, argv), {"runs": runs, "args": vars(args)})
    print("\n".join(_markdown(runs, args, argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
