"""Labelling throughput: the engine's cross-encoder scoring vs sentence-transformers'
``CrossEncoder.predict`` with its defaults, side by side in one run.

Same pairs (the STS benchmark's dev and test pairs, cycled, so real lengths; each copy after
the first has its copy number appended to both sentences, a token or two, so that copies do
not repeat sentences), same model
(a one-logit cross-encoder, saved once in fp32 and loaded by both), same device and threads.
Reports pairs/s for

- ``CrossEncoder.predict`` with its defaults (batch_size 32, fp32),
- the engine's scoring core (``score_pairs``: token-budget batches over length-sorted pairs,
  tokenisation of the next chunk overlapped) in each precision asked for; fp32 is exact,
  the others are checked against the peer's scores (largest difference, Spearman),
- optionally a sweep of token budgets,
- what each in-process labeller computed: padded tokens per pair and the model's FLOP/s,
  against this device's measured rate on the model's matrix products in that precision, and
  the most any fp32 labeller could reach on these pairs (no padding, every FLOP at that rate),
  and
- the engine's Ray pipeline end to end (``label_candidates``: a CPU tokenising stage ahead of
  GPU actors, shards committed to disk; actor start included, and its steady state from the
  first shard committed to the last), where Ray is installed.

    python benchmarks/labeling_speed.py                                   # 3,000 pairs on CPU
    python benchmarks/labeling_speed.py --model runs/x/models/cross_encoder  # a trained teacher
    python benchmarks/labeling_speed.py --ray-pairs 20000 --actors 1 2      # the Ray pool, 1 and 2 actors
    python benchmarks/labeling_speed.py --pairs 200000 --device cuda --precisions fp32 bf16 fp16 \\
        --token-budgets 16384 32768 65536 131072
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def stsb_pairs(data_dir: Path, n: int) -> tuple[list[str], list[str]]:
    from augsbert_ray.bench.data import sentence_pairs

    return sentence_pairs(data_dir, n)


def timed(fn, device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


class PassCounter:
    """Counts what a model's forward passes compute: padded tokens, and the sum of batch x
    length^2 that attention's score and value products grow with."""

    def __init__(self, model):
        import transformers

        # The base model: sentence-transformers calls the outer model's ``forward`` itself, which
        # hooks do not see, and the outer model calls the base model.
        hf = next(m for m in model.modules() if isinstance(m, transformers.PreTrainedModel))
        self.tokens = self.square = 0
        hf.base_model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        batch, length = ids.shape
        self.tokens += batch * length
        self.square += batch * length * length

    def snapshot(self) -> tuple[int, int]:
        return self.tokens, self.square


def model_flops(model) -> tuple[int, int]:
    """(FLOPs per token of the encoder's linear layers, FLOPs per unit of batch x length^2 of
    attention's two products). The pooler and head run once per pair and are left out."""
    import torch

    cfg = model.config
    per_token = sum(2 * m.in_features * m.out_features for name, m in model.base_model.named_modules()
                    if isinstance(m, torch.nn.Linear) and "pooler" not in name)
    return per_token, 4 * cfg.hidden_size * cfg.num_hidden_layers


def matmul_rate(model, precision: str, rows: int, device: str, repeats: int = 5) -> float:
    """FLOP/s of the encoder's linear layers alone, every shape once per layer, on ``rows``
    tokens, in ``precision`` (int8: dynamically quantised as the engine does): the best of
    ``repeats`` timings, so the rate this machine reaches on these matrices."""
    import torch

    from augsbert_ray.scoring import prepare_model

    shapes = [(m.in_features, m.out_features) for name, m in model.base_model.named_modules()
              if isinstance(m, torch.nn.Linear) and "pooler" not in name]
    stack = torch.nn.ModuleList(torch.nn.Linear(i, o) for i, o in shapes)
    stack = prepare_model(stack, precision, device).to(device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    inputs = {i: torch.randn(rows, i, device=device, dtype=dtype) for i, _ in shapes}
    flops = sum(2 * rows * i * o for i, o in shapes)
    with torch.inference_mode():
        times = [timed(lambda: [layer(inputs[layer.in_features]) for layer in stack], device)[1]
                 for _ in range(repeats + 1)]
    return flops / min(times[1:])  # the first pass warms up


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3000)
    p.add_argument("--model", default="embedded", help="the cross-encoder: embedded (a new head) or a saved one")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--precisions", nargs="+", help="engine precisions (default: fp32 and the device's auto)")
    p.add_argument("--token-budgets", nargs="*", type=int, default=[], help="also time each precision with these token budgets")
    p.add_argument("--max-pairs", type=int, default=None, help="most pairs per forward pass (default: config's)")
    p.add_argument("--actors", type=int, nargs="+", default=[1],
                   help="labelling actors of the Ray pool (several: one pipeline run each; threads shared)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timing rounds (median reported)")
    p.add_argument("--no-ray", action="store_true", help="skip the Ray pipeline rows")
    p.add_argument("--ray-pairs", type=int, help="pairs for the Ray pipeline rows (default: --pairs)")
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--out", default="benchmarks/results/labeling_speed")
    args = p.parse_args(argv)

    import torch
    import transformers
    from scipy.stats import spearmanr
    from sentence_transformers import CrossEncoder

    from augsbert_ray.bench.model_dirs import saved_cross_encoder
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.models import load_cross_encoder
    from provenance import write_result
    from augsbert_ray.scoring import CPU_TOKEN_BUDGET, GPU_TOKEN_BUDGET, prepare_model, resolve_precision, score_pairs

    gpu = args.device.startswith("cuda")
    torch.set_num_threads(args.threads)
    default_budget = GPU_TOKEN_BUDGET if gpu else CPU_TOKEN_BUDGET
    max_pairs = args.max_pairs or LabelingConfig().micro_batch_size
    precisions = args.precisions or ["fp32", resolve_precision("auto", args.device)]
    s1, s2 = stsb_pairs(Path(args.data_dir), args.pairs)
    model_dir = saved_cross_encoder(args.model, Path(tempfile.mkdtemp(prefix="labeling-speed-")) / "cross-encoder")
    rows, diffs, spread = [], {}, {}
    warm = min(2048, args.pairs)

    # Every labeller is set up once, warmed up, then timed in ``--repeats`` interleaved
    # rounds (the order rotates each round), so that a drift of the machine's speed reaches
    # all of them alike; the median time of each gives its pairs/s.
    peer = CrossEncoder(str(model_dir), device=args.device)
    sweep_precision = precisions[-1]
    models = {}
    for precision in dict.fromkeys(precisions):
        m, t = load_cross_encoder(str(model_dir), device=args.device)
        models[precision] = prepare_model(m, precision, args.device)
    from augsbert_ray.scoring import score_tokenized, tokenize_pairs

    tokens, tok_s = timed(lambda: tokenize_pairs(t, s1, s2, 128), "cpu")

    def engine(precision: str, budget: int, n: int):
        return score_pairs(models[precision], t, s1[:n], s2[:n], micro_batch_size=max_pairs, device=args.device,
                           token_budget=budget)

    # What each labeller computes, counted in its forward passes: padded tokens and attention's
    # batch x length^2, turned into FLOPs by the model's shapes (the peer's copy is fp32).
    counters = {"fp32 peer": PassCounter(peer)} | {p: PassCounter(m) for p, m in models.items()}
    peer_hf = next(m for m in peer.modules() if isinstance(m, transformers.PreTrainedModel))
    flops_token, flops_square = model_flops(peer_hf)
    work_of = {}  # labeller -> (its model's counter, precision)

    peer_name = "CrossEncoder.predict (defaults: batch 32, fp32)"
    runners = {peer_name: lambda n: np.asarray(
        peer.predict(list(zip(s1[:n], s2[:n])), show_progress_bar=False), dtype=np.float32)}
    work_of[peer_name] = (counters["fp32 peer"], "fp32")
    for precision in precisions:
        runners[f"engine: score_pairs, {precision}, token budget {default_budget}"] = \
            lambda n, p=precision: engine(p, default_budget, n)
        work_of[f"engine: score_pairs, {precision}, token budget {default_budget}"] = (counters[precision], precision)
    # The model's share alone: pairs tokenised beforehand, as a GPU actor gets them from the
    # CPU tokenising stage of the Ray pipeline.
    pre = f"engine: score_tokenized (pre-tokenised), {sweep_precision}, token budget {default_budget}"
    runners[pre] = lambda n: score_tokenized(models[sweep_precision], tokens, pad_id=t.pad_token_id,
                                             token_budget=default_budget, max_pairs=max_pairs, device=args.device)
    work_of[pre] = (counters[sweep_precision], sweep_precision)
    for precision in precisions:
        for budget in args.token_budgets:
            if budget != default_budget:
                runners[f"engine: score_pairs, {precision}, token budget {budget}"] = \
                    lambda n, p=precision, b=budget: engine(p, b, n)
                work_of[f"engine: score_pairs, {precision}, token budget {budget}"] = (counters[precision], precision)
    names = list(runners)
    for name in names:
        runners[name](warm)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in names}
    scores, work = {}, {name: np.zeros(2) for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before = work_of[name][0].snapshot()
            scores[name], dt = timed(lambda: runners[name](args.pairs), args.device)
            times[name].append(dt)
            work[name] += np.subtract(work_of[name][0].snapshot(), before)
    peer_scores = scores[names[0]]
    # This machine's rate on the model's matrix products in each precision, and the most any
    # labeller could reach in fp32: the pairs at their own lengths (no padding), every FLOP at
    # the fp32 rate (the pooler, head and the rest of the model left out: a bound).
    rates = {p: matmul_rate(peer_hf, p, default_budget, args.device) for p in dict.fromkeys(["fp32", *precisions])}
    lengths = tokens.lengths.astype(np.float64)
    ceiling = rates["fp32"] / (flops_token * lengths.mean() + flops_square * (lengths ** 2).mean())
    compute = {}
    for name in names:
        rows.append((name, args.pairs / float(np.median(times[name]))))
        spread[name] = (args.pairs / max(times[name]), args.pairs / min(times[name]))
        padded, square = work[name] / args.repeats
        flop_s = (flops_token * padded + flops_square * square) / float(np.median(times[name]))
        compute[name] = (padded / args.pairs, flop_s, flop_s / rates[work_of[name][1]])
        if name != names[0]:
            diffs[name] = (float(np.abs(scores[name] - peer_scores).max()), float(spearmanr(scores[name], peer_scores)[0]))
    rows.insert(len(precisions) + 2, (f"tokenisation alone ({os.cpu_count()} cores)", args.pairs / tok_s))
    peer = peer_hf = None  # the in-process models' memory (a GPU's too) is not needed any more
    models.clear()

    base = rows[0][1]
    where = torch.cuda.get_device_name() if gpu else f"{platform.processor() or platform.machine()}, {args.threads} threads"

    def write(done: str) -> None:
        """Writes what has been measured so far: a run stopped part-way keeps its figures."""
        lines = render(args, rows, diffs, spread, compute, rates, lengths, ceiling, base, where, gpu, default_budget,
                       max_pairs, argv, done)
        write_result(args.out, lines, {"pairs_per_s": dict(rows), "max_abs_diff_and_spearman": diffs,
                                       "args": vars(args), "rounds_pairs_per_s": spread, "device": where,
                                       "padded_tokens_per_pair_flop_s_share": compute, "matmul_flop_s": rates,
                                       "fp32_ceiling_pairs_per_s": ceiling, "measured": done})
        print("\n".join(lines), flush=True)

    write("the in-process labellers" + ("" if args.no_ray else "; the Ray pipeline rows follow"))

    if not args.no_ray:
        from augsbert_ray.bench.labeling import candidates
        from augsbert_ray.labeling import ShardStore, actor_cpus, label_candidates
        from augsbert_ray.runtime import start_ray

        cluster = start_ray(None, args.threads)
        n = args.ray_pairs or args.pairs
        r1, r2 = stsb_pairs(Path(args.data_dir), n)
        for actors in args.actors:
            cfg = LabelingConfig(actors=actors, num_gpus=1 if gpu else 0, micro_batch_size=max_pairs)
            commits = []
            store = ShardStore(Path(tempfile.mkdtemp(prefix="labeling-speed-shards-")))
            # As the job sizes them: GPU actors hold one CPU each and leave the rest to tokenising.
            cpus = actor_cpus(cfg, cluster.cpus, actors)
            pooled, dt = timed(lambda: label_candidates(candidates(r1, r2), str(model_dir), cfg, 128, cpus,
                                                        store=store, actors=actors,
                                                        on_commit=lambda: commits.append(time.perf_counter())),
                               args.device)
            precision = resolve_precision(cfg.precision, args.device)
            name = f"engine: Ray pipeline, {precision}, {n:,} pairs, {actors} actor(s), start included"
            rows.append((name, n / dt))
            m = min(n, args.pairs)  # the pairs the peer scored too (same order: ids follow the input)
            scores = pooled.column("label").to_numpy()[:m]
            diffs[name] = (float(np.abs(scores - peer_scores[:m]).max()), float(spearmanr(scores, peer_scores[:m])[0]))
            if len(commits) > 2:  # from the first shard committed to the last: the pool at work
                steady = (f"engine: Ray pipeline, {precision}, {actors} actor(s), steady state "
                          f"(shards 2-{len(commits)} of {cfg.block_size:,})")
                rows.append((steady, (n - cfg.block_size) / (commits[-1] - commits[0])))
            write(f"the Ray pipeline with {', '.join(map(str, args.actors[:args.actors.index(actors) + 1]))} "
                  "actor(s)")
    return 0


def render(args, rows, diffs, spread, compute, rates, lengths, ceiling, base, where, gpu, default_budget, max_pairs,
           argv, done: str) -> list[str]:
    """The result's table and readings, from what has been measured so far (``done`` says what)."""
    from provenance import provenance

    lines = ["# Labelling throughput vs CrossEncoder.predict", "",
             f"{args.pairs:,} STSb sentence pairs (dev + test, cycled), cross-encoder from `{args.model}`, "
             f"device {args.device} ({where}), at most {max_pairs} pairs per forward pass.", "",
             f"Each labeller timed in {args.repeats} interleaved rounds: pairs/s from the median round, "
             "with the slowest and fastest round's.", "",
             "| labeller | pairs/s | rounds' range | vs CrossEncoder.predict | largest score difference | "
             "Spearman with the peer |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, rate in rows:
        d = diffs.get(name)
        if name.startswith("tokenisation"):
            lines.append(f"| {name} | {rate:,.0f} | - | - | - | - |")
            continue
        lo_hi = spread.get(name)
        lines.append(f"| {name} | {rate:,.0f} | " + (f"{lo_hi[0]:,.0f}-{lo_hi[1]:,.0f}" if lo_hi else "-")
                     + f" | {rate / base:.2f}x | "
                     + (f"{d[0]:.1e} | {d[1]:.6f} |" if d else "- | - |"))
    lines += ["", f"Measured so far: {done}."]
    rate_text = ", ".join(f"{p} {r / 1e9:,.1f}" for p, r in rates.items())
    lines += ["", "What each in-process labeller computed (its forward passes counted; FLOPs of the encoder's "
              "linear layers and attention products, from the model's shapes):", "",
              "| labeller | padded tokens per pair | model GFLOP/s | of the matrix-product rate in its precision |",
              "|---|---:|---:|---:|"]
    lines += [f"| {name} | {c[0]:.1f} | {c[1] / 1e9:,.1f} | {100 * c[2]:.0f}% |" for name, c in compute.items()]
    lines += ["", f"Matrix-product rate on this device, the encoder's linear layers on {default_budget:,} tokens, "
              f"best of 5 (GFLOP/s): {rate_text}. The pairs have {lengths.mean():.1f} tokens on average; "
              f"scored with no padding and every FLOP at the fp32 rate, no fp32 labeller could exceed "
              f"{ceiling:,.0f} pairs/s here ({ceiling / base:.2f}x CrossEncoder.predict).",
              "", *provenance("benchmarks/labeling_speed.py", argv, machine=where if gpu else "")]
    return lines


if __name__ == "__main__":
    sys.exit(main())
