"""Training ingest: a training worker's peak memory with its pairs streamed, at 1M and 10M pairs,
and with the pairs held in memory (the path a small table still takes).

A synthetic student training set (gold pairs repeated, then silver pairs, as Parquet files: what
the silver stage writes) trains a tiny random bi-encoder (2 layers, hidden size 32, the embedded
model's tokenizer) through ``train_on_ray`` in one Ray Train worker for ``--steps`` steps, with
length grouping on (``training.length_grouping`` 50). The worker runs through a wrapper (the
same seam as the chaos tests' faults) that stops the training after ``--steps`` steps and reads
its own peak resident memory (``VmHWM`` in ``/proc/self/status``, the kernel's high-water mark)
and samples its anonymous memory (``RssAnon``) every 50 ms.

- ``streamed``: ``TrainingSet.from_files`` on a ``WorkerGroup`` (``training.ingest``): staged
  by the driver, each step's rows read from the staged file.
- ``in memory``: the same pairs as one table, under the executor's ``stream_above_rows``:
  through the object store, every pair held and tokenised by the worker.

The staged file's token lengths (``training.ingest.PairReader.lengths``) are written before the
streamed run from the synthetic sentences' own token counts (the pairs are drawn from a
vocabulary of ``--vocab`` sentences, each tokenised once by the recipe), under the name the
worker looks for: the worker loads them as it loads lengths it computed itself (the same
``uint16`` array), without a pass that would tokenise 20M sentences on this machine. A sample
of staged rows is checked against the recipe's own count first.

Memory figures are what count here: times on a shared machine are not benchmark figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

WORDS = ("a man woman child dog cat horse bird plays eats rides runs walks reads writes sings guitar piano "
         "ball bike horse book song the in on under near park street river beach quickly slowly happily "
         "small large red green old young").split()


@dataclass(frozen=True)
class Measured:
    """The training workers' function, stopped after ``steps`` steps, writing the worker's memory
    to ``out`` (a JSON file). Defined in the script, so Ray ships it to the worker by value."""

    steps: int
    out: str
    limit_mib: float = 0.0  # a worker whose RSS passes it stops (a shared machine's guard); 0: none

    def __call__(self, config: dict) -> None:
        import threading

        from augsbert_ray.training import loop, ray_trainer

        init = loop.PairTrainer.__init__
        peak_anon = [0]
        stop = threading.Event()

        def status() -> dict:
            fields = {}
            with open("/proc/self/status", encoding="ascii") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                        fields[key] = int(value.split()[0]) / 1024  # kB -> MiB
            return fields

        def sample() -> None:
            while not stop.wait(0.05):
                now = status()
                peak_anon[0] = max(peak_anon[0], now.get("RssAnon", 0))
                if self.limit_mib and now["VmRSS"] > self.limit_mib:
                    Path(self.out).write_text(json.dumps({
                        "peak_rss_mib": now["VmHWM"], "peak_anon_sampled_mib": peak_anon[0],
                        "rss_before_training_mib": before["VmRSS"],
                        "stopped": f"stopped at {now['VmRSS']:.0f} MiB (--limit-mib), before its first step"
                                   if not started_steps[0] else f"stopped at {now['VmRSS']:.0f} MiB (--limit-mib)"}))
                    os._exit(1)

        started_steps = [False]

        def capped(trainer, *args, **kwargs):
            init(trainer, *args, **kwargs)
            trainer.total = min(trainer.total, self.steps)
            started_steps[0] = True

        before = status()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        loop.PairTrainer.__init__ = capped
        started = time.perf_counter()
        try:
            ray_trainer._train_loop_per_worker(config)
        finally:
            loop.PairTrainer.__init__ = init
            stop.set()
            sampler.join()
        after = status()
        Path(self.out).write_text(json.dumps({
            "peak_rss_mib": after["VmHWM"], "rss_at_end_mib": after["VmRSS"],
            "anon_at_end_mib": after.get("RssAnon"), "file_at_end_mib": after.get("RssFile"),
            "peak_anon_sampled_mib": max(peak_anon[0], after.get("RssAnon", 0)),
            "rss_before_training_mib": before["VmRSS"], "worker_seconds": time.perf_counter() - started}))


def tiny_model(root: Path) -> str:
    """A 2-layer random BERT on the embedded model's tokenizer (tests/conftest.py's)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from augsbert_ray.models import embedded_model_dir

    out = root / "tiny-bert"
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir(verify=False)))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=256)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return str(out)


def vocabulary(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 25)))).capitalize() + "." for _ in range(n)]


def write_pairs(path: Path, vocab, rows: int, seed: int, chunk: int = 1_000_000) -> np.ndarray:
    """``rows`` pairs of vocabulary sentences with random labels, to Parquet; returns their
    (first, second) vocabulary indices."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(vocab), size=(rows, 2), dtype=np.int32)
    schema = pa.schema([("sentence1", pa.string()), ("sentence2", pa.string()), ("label", pa.float32())])
    with pq.ParquetWriter(path, schema) as writer:
        for i in range(0, rows, chunk):
            part = idx[i:i + chunk]
            writer.write_table(pa.table({"sentence1": vocab.take(pa.array(part[:, 0])),
                                         "sentence2": vocab.take(pa.array(part[:, 1])),
                                         "label": pa.array(rng.random(len(part), dtype=np.float32))}, schema=schema))
    return idx


def run_one(args, model: str, root: Path, vocab, vocab_lengths: np.ndarray, rows: int, way: str) -> dict:
    from augsbert_ray.errors import TrainingError
    from augsbert_ray.training import ingest, ray_trainer
    from augsbert_ray.training.executors import WorkerGroup
    from augsbert_ray.training.ingest import TrainingSet
    from augsbert_ray.training.loop import pair_lengths
    from augsbert_ray.training.ray_trainer import WorkerResources, train_on_ray
    from augsbert_ray.training.recipes import make_recipe

    folder = root / f"{way.replace(' ', '-')}-{rows}"
    folder.mkdir(parents=True, exist_ok=True)
    gold_rows = args.gold
    silver_rows = rows - gold_rows * args.gold_repeat
    gold_idx = write_pairs(folder / "gold.parquet", vocab, gold_rows, 1)
    silver_idx = write_pairs(folder / "silver.parquet", vocab, silver_rows, 2)
    given = TrainingSet.from_files(folder / "gold.parquet", folder / "silver.parquet", gold_repeat=args.gold_repeat)
    assert given.num_rows == rows
    recipe = {"model": model, "max_length": 128}
    hparams = {"epochs": 1, "lr": 1e-4, "batch_size": args.batch_size, "warmup_ratio": 0.1, "seed": 42,
               "length_grouping": 50, "precision": "fp32"}
    storage, run = str(folder / "ray_train"), f"ingest-{rows}"
    record = {"way": way, "rows": rows, "gold": gold_rows, "gold_repeat": args.gold_repeat, "silver": silver_rows}
    t0 = time.perf_counter()
    if way == "streamed":
        staged = ingest.stage(given, f"{storage}/{run}-pairs")
        record["staged_file_mib"] = os.path.getsize(staged.location) / 2**20
        both = np.concatenate([np.tile(gold_idx, (args.gold_repeat, 1)), silver_idx])
        lengths = np.maximum(vocab_lengths[both[:, 0]], vocab_lengths[both[:, 1]]).astype(np.uint16)
        del both
        sample = np.random.default_rng(0).choice(rows, size=2000, replace=False)
        reader, r = ingest.PairReader(staged), make_recipe("bi_encoder", **recipe)
        r.build("cpu")
        s1, s2, _, _ = reader.fetch(sample)
        assert np.array_equal(pair_lengths(r, r.pretokenize(s1, s2), len(sample)), lengths[sample]), \
            "the synthetic lengths differ from the recipe's"
        ingest.write_lengths(staged, {"kind": "bi_encoder", **recipe}, lengths)
        del lengths, reader, r
        pairs, executor = given, WorkerGroup(stream_above_rows=0)
    else:
        pairs, executor = given.to_table(), WorkerGroup(stream_above_rows=rows)
        record["table_mib"] = pairs.nbytes / 2**20
    record["prepare_seconds"] = time.perf_counter() - t0
    out = folder / "worker.json"
    ray_trainer._train_loop_per_worker = Measured(args.steps, str(out), args.limit_mib)
    t0 = time.perf_counter()
    try:
        stats = train_on_ray("bi_encoder", pairs, recipe=recipe, hparams=hparams,
                             resources=WorkerResources(1, False, args.cpus, checkpoint_every=0, max_failures=0),
                             storage_dir=storage, out_dir=folder / "model", name=run, executor=executor)
    except TrainingError:
        if not out.is_file():
            raise
        stats = {"steps": None, "train_pairs": rows}  # stopped at --limit-mib: its peak is a lower bound
    record["train_on_ray_seconds"] = time.perf_counter() - t0
    record.update(steps=stats["steps"], train_pairs=stats["train_pairs"], **json.loads(out.read_text()))
    del pairs
    print(json.dumps(record), flush=True)
    return record


def render(records: list[dict], args, argv) -> list[str]:
    from provenance import provenance

    def find(way, rows):
        return next((r for r in records if r["way"] == way and r["rows"] == rows), None)

    lines = ["# Training ingest: a training worker's memory, streamed and in memory", "",
             f"One Ray Train worker ({args.cpus} CPUs) trains a tiny random bi-encoder (2 layers, hidden size 32) on a "
             f"synthetic student training set ({args.gold:,} gold pairs x{args.gold_repeat}, the rest silver, as "
             f"Parquet files) for {args.steps} steps of {args.batch_size} pairs, length grouping 50. Peak RSS is the "
             "worker's `VmHWM`; anonymous memory is `RssAnon` sampled every 50 ms (file pages are the libraries' "
             "and the staged file's, which the kernel can drop).", "",
             "| pairs | way | peak RSS (MiB) | peak anonymous (MiB) | RSS before training (MiB) | staged file / table (MiB) "
             "| note |",
             "|---:|---|---:|---:|---:|---:|---|"]
    for r in records:
        size = r.get("staged_file_mib", r.get("table_mib"))
        anon, before = r.get("peak_anon_sampled_mib"), r.get("rss_before_training_mib")
        lines.append(f"| {r['rows']:,} | {r['way']} | {r['peak_rss_mib']:.0f}{'+' * bool(r.get('stopped'))} | "
                     f"{'' if anon is None else f'{anon:.0f}'} | {'' if before is None else f'{before:.0f}'} | "
                     f"{'' if size is None else f'{size:.0f}'} | {r.get('stopped', '')} |")
    lines.append("")
    small, large = find("streamed", min(args.sizes)), find("streamed", max(args.sizes))
    if small and large and small is not large:
        ratio = large["peak_rss_mib"] / small["peak_rss_mib"]
        anon = large["peak_anon_sampled_mib"] / small["peak_anon_sampled_mib"]
        lines += [f"Streamed, {large['rows']:,} against {small['rows']:,} pairs: peak RSS {ratio:.3f}x "
                  f"(target <= 1.2x), peak anonymous memory {anon:.3f}x; "
                  f"+{large['peak_rss_mib'] - small['peak_rss_mib']:.0f} MiB for "
                  f"{large['rows'] - small['rows']:,} more pairs "
                  f"({(large['peak_rss_mib'] - small['peak_rss_mib']) * 2**20 / (large['rows'] - small['rows']):.1f} "
                  "bytes a pair: the epoch's row indices and token lengths, see training/ingest.py).", ""]
    for rows in sorted({r["rows"] for r in records}):
        s, m = find("streamed", rows), find("in memory", rows)
        if s and m:
            least = "at least " if m.get("stopped") else ""
            lines += [f"At {rows:,} pairs the in-memory path's worker reached {least}{m['peak_rss_mib']:,.0f} MiB, "
                      f"{least}{m['peak_rss_mib'] / s['peak_rss_mib']:.1f}x the streamed worker's.", ""]
    return lines + provenance("benchmarks/training_ingest.py", argv)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000], help="pairs, streamed")
    p.add_argument("--in-memory", type=int, nargs="*", default=[1_000_000], help="pairs held in memory (today's path)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--gold", type=int, default=5_749, help="gold pairs (STSb's train split's size)")
    p.add_argument("--gold-repeat", type=int, default=3)
    p.add_argument("--vocab", type=int, default=50_000, help="distinct synthetic sentences")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--limit-mib", type=float, default=0,
                   help="stop a worker whose RSS passes this (its peak is then a lower bound); 0: no limit")
    p.add_argument("--root", default="", help="where the data and runs go (default: a temporary folder)")
    p.add_argument("--out", default="benchmarks/results/training_ingest")
    args = p.parse_args(argv)

    import pyarrow as pa
    import ray

    from augsbert_ray.runtime import (
        LOCAL_TRAIN_ENV_DEFAULTS,
        TRAIN_ENV_DEFAULTS,
        local_ray_options,
    )
    from augsbert_ray.training.recipes import make_recipe

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for key, value in {**TRAIN_ENV_DEFAULTS, **LOCAL_TRAIN_ENV_DEFAULTS}.items():
        os.environ.setdefault(key, value)
    root = Path(args.root or tempfile.mkdtemp(prefix="training-ingest-"))
    root.mkdir(parents=True, exist_ok=True)
    model = tiny_model(root)
    texts = vocabulary(args.vocab, 0)
    recipe = make_recipe("bi_encoder", model=model, max_length=128)
    recipe.build("cpu")
    vocab_lengths = recipe.pretokenize(texts, []).lengths.astype(np.int64)
    vocab = pa.array(texts, pa.string())
    ray.init(address="local", **local_ray_options(args.cpus), include_dashboard=False, log_to_driver=False)
    records = []
    try:
        for rows in sorted(args.sizes):
            records.append(run_one(args, model, root, vocab, vocab_lengths, rows, "streamed"))
        for rows in sorted(args.in_memory):
            records.append(run_one(args, model, root, vocab, vocab_lengths, rows, "in memory"))
    finally:
        ray.shutdown()
    from provenance import write_result

    write_result(args.out, render(records, args, argv), {"runs": records, "args": vars(args)})
    print("\n".join(render(records, args, argv)))


if __name__ == "__main__":
    main()
