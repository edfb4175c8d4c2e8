"""A labelling actor's own memory and speed on CPU, with and without filled batches.

The labelling actor scores each block of pairs in batches cut by length (``scoring``): the
batches of one width have one size, except a block's last, shortest batch, whose size is what
is left. oneDNN compiles and keeps a kernel per input shape, so without filling almost every
block brings a new shape. ``scoring.fill_rows`` fills that batch up to its width's full size.

This script does what the actor does, outside Ray so that nothing else is measured: it loads a
cross-encoder in the job's precision, then scores ``--blocks`` blocks of ``--block-pairs`` pairs
each (sentences of a synthetic corpus drawn from the STS benchmark's lengths and words,
``scale.write_corpus``), with the engine's token budget. Each side (filled, not filled) runs in
a fresh process, the sides alternating over ``--rounds``. It records the process's own memory
(RssAnon) as it goes, the batch shapes the model saw, the time, and a digest of every score:
the digests of the two sides must be equal.

    python benchmarks/labeling_shapes.py --work /tmp/shapes                     # tiny model, 300 blocks
    python benchmarks/labeling_shapes.py --model embedded --blocks 40 --work /tmp/shapes --out /tmp/shapes/mini
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MIB = 2 ** 20


def _anon() -> int:
    """This process's own resident memory (RssAnon, bytes), as the memory sampler reads it."""
    from augsbert_ray.bench.memory import _rss_parts

    return _rss_parts()[0]


def one_side(args) -> dict:
    """Scores the blocks in this process; memory, shapes, time and the scores' digest."""
    import numpy as np
    import torch

    from augsbert_ray.models import load_cross_encoder
    from augsbert_ray.scoring import CPU_TOKEN_BUDGET, prepare_model, resolve_precision, score_tokenized, tokenize_pairs

    torch.set_num_threads(args.threads)
    start = _anon()
    model, tok = load_cross_encoder(args.model_dir, device="cpu")
    precision = resolve_precision(args.precision, "cpu")
    model = prepare_model(model, precision, "cpu")
    shapes: set = set()
    model.register_forward_pre_hook(lambda _, a, kw: shapes.add(tuple(kw["input_ids"].shape)), with_kwargs=True)
    lines = Path(args.corpus).read_text(encoding="utf-8").splitlines()
    loaded, digest, points = _anon(), hashlib.sha256(), []
    t0 = time.perf_counter()
    for b in range(args.blocks):
        pairs = lines[2 * b * args.block_pairs:2 * (b + 1) * args.block_pairs]
        tokens = tokenize_pairs(tok, pairs[0::2], pairs[1::2], args.max_length)
        scores = score_tokenized(model, tokens, pad_id=tok.pad_token_id or 0, token_budget=CPU_TOKEN_BUDGET,
                                 max_pairs=4096, device="cpu", fill=args.fill == "on")
        digest.update(np.asarray(scores, np.float32).tobytes())
        if (b + 1) % max(1, args.blocks // 12) == 0 or b + 1 == args.blocks:
            points.append((b + 1, round(time.perf_counter() - t0, 2), _anon(), len(shapes)))
    return {"fill": args.fill, "precision": precision, "start": start, "loaded": loaded, "points": points,
            "seconds": time.perf_counter() - t0, "shapes": len(shapes), "digest": digest.hexdigest()}


def _markdown(runs: list[dict], args, argv) -> list[str]:
    from provenance import cpu_description, provenance

    pairs = args.blocks * args.block_pairs
    same = len({r["digest"] for r in runs}) == 1
    lines = ["# A labelling actor's memory and speed on CPU: batches filled to one shape per width, or not", "",
             f"Model: {args.model}; {runs[0]['precision']}, {args.threads} threads; {args.blocks} blocks of "
             f"{args.block_pairs:,} pairs ({pairs:,} pairs), the engine's CPU token budget; each side a fresh "
             "process, the sides alternating. Memory: the process's own (RssAnon), before the model was loaded, "
             "after, and after a quarter, half, three quarters and all of the blocks.", "",
             "| round | filled | shapes seen | MiB: start / loaded | 1/4 | 1/2 | 3/4 | end | seconds | pairs/s |",
             "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        pts = r["points"]

        def at(fraction):
            return pts[min(len(pts) - 1, max(0, round(len(pts) * fraction) - 1))][2] / MIB

        lines.append(f"| {r['round']} | {r['fill']} | {r['shapes']} | {r['start'] / MIB:,.0f} / "
                     f"{r['loaded'] / MIB:,.0f} | {at(0.25):,.0f} | {at(0.5):,.0f} | {at(0.75):,.0f} | "
                     f"{pts[-1][2] / MIB:,.0f} | {r['seconds']:.1f} | {pairs / r['seconds']:,.0f} |")
    lines += ["", f"Every score equal on both sides (a digest of all of them): {'yes' if same else 'NO'}.", "",
              f"CPU: {cpu_description()}.", "", *provenance("benchmarks/labeling_shapes.py", argv)]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny (a 2-layer random BERT), embedded, or a cross-encoder folder")
    p.add_argument("--blocks", type=int, default=300)
    p.add_argument("--block-pairs", type=int, default=1024, help="pairs per block (the CPU labelling shard's size)")
    p.add_argument("--precision", default="auto", help="as labeling.precision (auto: bf16 where the CPU has it)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--work", required=True, help="where the corpus and the model go (not the repository)")
    p.add_argument("--out", default="benchmarks/results/labelling_shapes_cpu")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fill", choices=["on", "off"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        Path(args.result).write_text(json.dumps(one_side(args)))
        return 0

    from provenance import write_result
    from scale import write_corpus

    from augsbert_ray.bench.model_dirs import saved_cross_encoder, tiny_cross_encoder

    argv = sys.argv[1:] if argv is None else argv
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    n = 2 * args.blocks * args.block_pairs
    corpus = work / f"corpus-{n}.txt"
    if not corpus.exists():
        write_corpus(corpus, n, Path(args.data_dir))
    model_dir = work / f"model-{args.model.replace('/', '_')}"
    if not model_dir.exists():
        if args.model == "tiny":
            tiny_cross_encoder(model_dir)
        elif args.model == "embedded":
            saved_cross_encoder("embedded", model_dir)
        else:
            model_dir = Path(args.model)
    runs = []
    for rnd in range(1, args.rounds + 1):
        for fill in ("off", "on") if rnd % 2 else ("on", "off"):
            result = work / f"side-{fill}.json"
            subprocess.run([sys.executable, __file__, "--one", "--fill", fill, "--model-dir", str(model_dir),
                            "--corpus", str(corpus), "--result", str(result), "--work", str(work),
                            "--blocks", str(args.blocks),
                            "--block-pairs", str(args.block_pairs), "--precision", args.precision,
                            "--threads", str(args.threads), "--max-length", str(args.max_length)], check=True)
            r = {**json.loads(result.read_text()), "round": rnd}
            runs.append(r)
            print(f"[shapes] round {rnd}, filled {fill}: {r['shapes']} shapes, {r['points'][-1][2] / MIB:,.0f} MiB "
                  f"at the end, {r['seconds']:.1f} s", flush=True)
            write_result(args.out, _markdown(runs, args, argv), {"runs": runs, "args": vars(args)})
    print("\n".join(_markdown(runs, args, argv)))
    return 0 if len({r["digest"] for r in runs}) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
