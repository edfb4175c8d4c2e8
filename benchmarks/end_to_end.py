"""End-to-end wall time of an AugSBERT BM25 job: the engine vs a plain sequential script that
does the same steps with sentence-transformers alone, side by side in one run.

The engine runs the job as ``augsbert run JOB`` (on an embedded local Ray unless
``RAY_ADDRESS`` names a cluster). The script, in a Python process of its own, takes the very
same gold pairs (the first engine run's ``gold/*.parquet``, so both see the same subsample)
and the job's hyperparameters, and does what a user of sentence-transformers alone would
write, in one process:
``CrossEncoder.fit`` on gold, ``SentenceTransformer`` zero-shot, ``SentenceTransformer.fit``
on gold (``CosineSimilarityLoss``), BM25 top-k per sentence with ``rank_bm25`` (the self
hit, pairs seen before and gold pairs dropped), ``CrossEncoder.predict`` to label them, and
``SentenceTransformer.fit`` on gold + silver; each model is scored on dev and test. Both
report wall time per step and test Spearman; each side's wall time runs from its process's
start to its exit. With ``--repeat N`` the sides alternate N times.

Regression jobs (STSb) with ``sampling.strategy: bm25`` only. ``--device cuda`` runs both
sides on the GPU: the script's models on ``cuda``, the engine with
``training.use_gpu=true labeling.num_gpus=1``.

    pip install -e ".[bench]"
    python benchmarks/end_to_end.py                                   # jobs/stsb-1k-bm25.yaml
    python benchmarks/end_to_end.py --job jobs/stsb-bm25.yaml         # all 5,749 gold pairs
    python benchmarks/end_to_end.py --job jobs/stsb-bm25.yaml --device cuda
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from scipy.stats import spearmanr

_TOKEN = re.compile(r"[A-Za-z0-9]+")


def _spearman(a, b) -> float:
    return 100 * float(spearmanr(a, b)[0])


def plain_script(cfg, gold: dict, log, device: str = "cpu") -> tuple[dict, dict, dict]:
    """The job's steps with sentence-transformers (and rank_bm25) alone; (seconds, scores, counts)."""
    import rank_bm25
    import torch
    from sentence_transformers import CrossEncoder, InputExample, SentenceTransformer, losses
    from torch.utils.data import DataLoader

    from augsbert_ray.models import resolve_model

    torch.manual_seed(cfg.bi_encoder.seed if cfg.bi_encoder.seed is not None else cfg.seed)
    ce_cfg, bi_cfg = cfg.cross_encoder, cfg.bi_encoder
    ce_path, bi_path = str(resolve_model(ce_cfg.model)), str(resolve_model(bi_cfg.model))
    cols = {s: (t.column("sentence1").to_pylist(), t.column("sentence2").to_pylist(), t.column("label").to_numpy())
            for s, t in gold.items()}
    s1, s2, y = cols["train"]
    seconds, scores, counts = {}, {}, {}

    def bi_scores(model) -> dict:
        out = {}
        for split in ("dev", "test"):
            a, b, labels = cols[split]
            ea = model.encode(a, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
            eb = model.encode(b, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
            out[split] = _spearman((ea * eb).sum(-1).cpu().numpy(), labels)
        return out

    def new_bi() -> SentenceTransformer:
        model = SentenceTransformer(bi_path, device=device)
        model.max_seq_length = bi_cfg.max_length
        if bi_cfg.num_layers is not None:  # the job's smaller student: its first N layers
            model[0].auto_model.encoder.layer = model[0].auto_model.encoder.layer[:bi_cfg.num_layers]
        return model

    def fit_bi(examples) -> SentenceTransformer:
        model = new_bi()
        loader = DataLoader(examples, shuffle=True, batch_size=bi_cfg.batch_size)
        steps = len(loader) * bi_cfg.epochs
        model.fit(train_objectives=[(loader, losses.CosineSimilarityLoss(model))], epochs=bi_cfg.epochs,
                  warmup_steps=math.ceil(bi_cfg.warmup_ratio * steps), optimizer_params={"lr": bi_cfg.lr},
                  show_progress_bar=False)
        return model

    gold_examples = [InputExample(texts=[a, b], label=float(v)) for a, b, v in zip(s1, s2, y)]

    t0 = time.perf_counter()
    teacher = CrossEncoder(ce_path, num_labels=1, max_length=ce_cfg.max_length, device=device)
    loader = DataLoader(gold_examples, shuffle=True, batch_size=ce_cfg.batch_size)
    teacher.fit(train_dataloader=loader, epochs=ce_cfg.epochs,
                warmup_steps=math.ceil(ce_cfg.warmup_ratio * len(loader) * ce_cfg.epochs),
                optimizer_params={"lr": ce_cfg.lr}, show_progress_bar=False)
    scores["cross_encoder"] = {split: _spearman(teacher.predict(list(zip(a, b)), show_progress_bar=False), labels)
                               for split, (a, b, labels) in cols.items() if split != "train"}
    seconds["cross_encoder"] = time.perf_counter() - t0
    log(f"[script] cross-encoder: {seconds['cross_encoder']:.0f} s, {scores['cross_encoder']}")

    t0 = time.perf_counter()
    scores["zero_shot"] = bi_scores(new_bi())
    seconds["zero_shot"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    scores["gold_only"] = bi_scores(fit_bi(gold_examples))
    seconds["gold_only"] = time.perf_counter() - t0
    log(f"[script] gold-only bi-encoder: {seconds['gold_only']:.0f} s, {scores['gold_only']}")

    t0 = time.perf_counter()
    sentences = list(dict.fromkeys(s1 + s2))
    bm25 = rank_bm25.BM25Okapi([[w.lower() for w in _TOKEN.findall(s)] for s in sentences])
    gold_pairs = {frozenset(p) for p in zip(s1, s2)}
    seen, pairs = set(), []
    k = cfg.sampling.top_k
    for i, s in enumerate(sentences):
        top = np.argsort(-bm25.get_scores([w.lower() for w in _TOKEN.findall(s)]), kind="stable")[:k + 1]
        for j in [j for j in top if j != i][:k]:
            key = frozenset((s, sentences[j]))
            if len(key) == 2 and key not in seen and key not in gold_pairs:
                seen.add(key)
                pairs.append((s, sentences[j]))
    seconds["candidates"] = time.perf_counter() - t0
    counts["candidates"] = len(pairs)

    t0 = time.perf_counter()
    silver = teacher.predict(pairs, show_progress_bar=False)
    seconds["silver"] = time.perf_counter() - t0
    log(f"[script] BM25 {seconds['candidates']:.0f} s and labelling {seconds['silver']:.0f} s: {len(pairs)} pairs")

    t0 = time.perf_counter()
    silver_examples = [InputExample(texts=[a, b], label=float(v)) for (a, b), v in zip(pairs, silver)]
    scores["augsbert"] = bi_scores(fit_bi(gold_examples + silver_examples))
    seconds["augsbert"] = time.perf_counter() - t0
    log(f"[script] AugSBERT bi-encoder: {seconds['augsbert']:.0f} s, {scores['augsbert']}")
    return seconds, scores, counts


def _side_script(args) -> int:
    """One run of the plain script, in a process of its own: its timings go to ``args.json``."""
    from augsbert_ray.config import load_job

    cfg = load_job(args.job, args.extra)
    gold = {s: pq.read_table(Path(args.gold) / f"{s}.parquet") for s in ("train", "dev", "test")}
    t0 = time.perf_counter()
    seconds, scores, counts = plain_script(cfg, gold, print, args.device)
    Path(args.json).write_text(json.dumps({"seconds": seconds, "scores": scores, "counts": counts,
                                           "in_process_s": time.perf_counter() - t0}), encoding="utf-8")
    return 0


def _timed(cmd: list[str], log: Path) -> float:
    """Runs ``cmd`` to its end (its output to ``log``); its wall time, process start to exit."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {rc}); see {log}")
    return wall


def _report(args, argv, cfg, root: Path, runs: list[dict]) -> None:
    """Writes the comparison of the ``runs`` so far (``args.out``.md and .json) and prints it."""
    from provenance import provenance, write_result

    steps = ["cross_encoder", "zero_shot", "gold_only", "candidates", "silver", "augsbert"]
    metric = runs[-1]["engine"]["metric"]
    names = {"cross_encoder": "cross-encoder: train + score dev/test", "zero_shot": "zero-shot bi-encoder: score",
             "gold_only": "gold-only bi-encoder: train + score", "candidates": "BM25 candidates",
             "silver": "label candidates", "augsbert": "AugSBERT bi-encoder: train + score"}
    gold_rows = pq.read_metadata(root / "engine-0" / "gold" / "train.parquet").num_rows
    lines = ["# End to end: the engine vs a sequential sentence-transformers script", "",
             f"Job `{args.job}`" + (f" with {' '.join(args.extra)}" if args.extra else "")
             + f": {gold_rows:,} gold training pairs, BM25 top-{cfg.sampling.top_k}. Same gold pairs and "
             "hyperparameters for both. Each side is a fresh process started as its user starts it "
             "(`augsbert run JOB`; `python script.py`), the sides alternating, one at a time.", "",
             "| step | " + " | ".join(f"engine {i + 1} (s) | script {i + 1} (s)" for i in range(len(runs))) + " |",
             "|---|" + "---:|---:|" * len(runs)]
    lines += [f"| {names[s]} | " + " | ".join(f"{r['engine']['stage_seconds'][s]:.1f} | {r['script']['seconds'][s]:.1f}"
                                              for r in runs) + " |" for s in steps]
    lines += ["| **wall time, process start to exit** | " + " | ".join(
        f"**{r['engine']['wall_s']:.1f}** | **{r['script']['wall_s']:.1f}**" for r in runs) + " |", ""]
    ratios = [r["engine"]["wall_s"] / r["script"]["wall_s"] for r in runs]
    lines += [f"Engine / script wall time: {', '.join(f'{x:.2f}' for x in ratios)} (below 1: the engine is faster; "
              "its time includes starting Ray, checkpoints and its report; the script's its imports).", "",
              f"| test {metric} | engine | script |", "|---|---:|---:|"]
    last = runs[-1]
    lines += [f"| {k_} | {last['engine']['scores'][k_]['test'][metric]:.2f} | {last['script']['scores'][k_]['test']:.2f} |"
              for k_ in ("cross_encoder", "zero_shot", "gold_only", "augsbert")]
    lines += [f"| silver pairs | {last['engine']['silver']:,} | {last['script']['counts']['candidates']:,} |"]
    lines += ["", *provenance("benchmarks/end_to_end.py", argv)]
    write_result(args.out, lines, {"runs": runs, "ratios": ratios, "args": vars(args)})
    print("\n".join(lines))


def _require_peer() -> None:
    """The script's own libraries, or an error that says how to install them."""
    import importlib.util

    missing = [m for m in ("rank_bm25", "accelerate", "datasets") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"benchmarks/end_to_end.py: the plain script needs {', '.join(missing)}, which this "
                         "environment lacks: pip install -e \".[bench]\"")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="jobs/stsb-1k-bm25.yaml")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--root", default="", help="where the runs and their logs go (default: a temporary folder)")
    p.add_argument("--out", default="benchmarks/results/end_to_end")
    p.add_argument("--repeat", type=int, default=1, help="runs of each side, alternating engine and script")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: both sides on the GPU")
    p.add_argument("--side", choices=("script",), help=argparse.SUPPRESS)  # one side, in its own process
    p.add_argument("--gold", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side == "script":
        return _side_script(args)

    from augsbert_ray.config import load_job

    _require_peer()  # before the engine's side runs for minutes
    root = Path(args.root or tempfile.mkdtemp(prefix="augsbert-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    cfg = load_job(args.job, args.extra)
    if cfg.task != "regression" or cfg.sampling.strategy != "bm25" or cfg.target is not None:
        raise SystemExit(f"{args.job}: this benchmark compares in-domain regression jobs with BM25 sampling")
    # The CLI as installed, else as a module (wheels installed with pip --target have no scripts).
    augsbert = Path(sys.executable).with_name("augsbert")
    engine_cmd = [str(augsbert)] if augsbert.exists() else [sys.executable, "-m", "augsbert_ray.cli"]
    on_gpu = ["training.use_gpu=true", "labeling.num_gpus=1"] if args.device.startswith("cuda") else []
    steps = ["cross_encoder", "zero_shot", "gold_only", "candidates", "silver", "augsbert"]
    runs = []
    # Each side runs as its user would start it, in a fresh process (imports and Ray's start
    # included), one after the other on an otherwise idle machine.
    for r in range(args.repeat):
        run_dir = root / f"engine-{r}"
        shutil.rmtree(run_dir, ignore_errors=True)
        engine_wall = _timed([*engine_cmd, "run", args.job, *on_gpu, *args.extra, f"run_dir={run_dir}"],
                             root / f"engine-{r}.log")
        engine = json.loads((run_dir / "metrics.json").read_text())
        print(f"[engine {r + 1}/{args.repeat}] {engine_wall:.1f} s", flush=True)
        side = root / f"script-{r}.json"
        script_wall = _timed([sys.executable, __file__, "--side", "script", "--job", args.job, "--device", args.device,
                              *[a for x in args.extra for a in ("--set", x)], "--gold", str(root / "engine-0" / "gold"),
                              "--json", str(side)], root / f"script-{r}.log")
        script = json.loads(side.read_text())
        print(f"[script {r + 1}/{args.repeat}] {script_wall:.1f} s", flush=True)
        # A step of the script is a training stage and its evaluation in the engine.
        eng_s = {s: engine["stage_seconds"].get(s, 0.0) + engine["stage_seconds"].get(f"eval_{s}", 0.0)
                 for s in steps}
        runs.append({"engine": {"wall_s": engine_wall, "stage_seconds": eng_s, "scores": engine["scores"],
                                "metric": engine["primary_metric"],
                                "silver": engine["sampling"]["silver"]},
                     "script": {"wall_s": script_wall, **script}})
        _report(args, argv, cfg, root, runs)  # after every pair, so a stopped run keeps what it measured

    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
