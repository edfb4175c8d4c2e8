"""What a training run costs besides training: the engine's Ray Train runs against Ray Train's
defaults, side by side on one local Ray, and the local Ray's log monitor at Ray's default
scan rate and at the engine's.

1. ``training``: ``train_on_ray`` on a few pairs with a tiny random model (a 2-layer BERT on
   the embedded model's tokenizer), so that nearly all of a run is fixed cost. One run first
   to warm the Ray up (not counted), then the two variants alternately: the engine's trainer
   (no dataset manager without datasets, no placement-group cleaner on one node) and a plain
   ``TorchTrainer`` with all of Ray Train's default helpers. Per run: wall seconds, the whole
   machine's busy CPU-seconds (``/proc/stat``; run it on an idle machine) and the Ray actors
   it started.
2. ``log-monitor``: a local Ray in a new process per setting, 60 one-call tasks (each a new
   worker process, so new log files), then the log monitor's CPU-seconds over a minute idle,
   at Ray's default (``RAY_LOG_MONITOR_MANY_FILES_THRESHOLD=1000``: a scan for new files every
   0.1 s) and at the engine's (``0``: every 0.5 s).

    python benchmarks/train_overhead.py --runs 3
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

def busy_cpu_seconds() -> float:
    """The whole machine's non-idle CPU time so far (Linux)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def training_part(args, work: Path) -> dict:
    import pyarrow as pa
    from ray._private import state
    from ray.train.torch import TorchTrainer

    from augsbert_ray import runtime
    from augsbert_ray.training import executors, ray_trainer

    from augsbert_ray.bench.model_dirs import tiny_cross_encoder

    model = tiny_cross_encoder(work / "tiny")
    runtime.start_ray(num_cpus=args.cpus, verbose=False, log_dir=work / "ray-logs")
    n = 48
    pairs = pa.table({"sentence1": [f"a man is playing {i}" for i in range(n)],
                      "sentence2": [f"someone plays {i}" for i in range(n)],
                      "label": pa.array([i / n for i in range(n)], pa.float32())})
    resources = ray_trainer.WorkerResources(1, False, float(args.cpus))
    engine = executors.trainer_class()

    def one(variant: str, k: int) -> dict:
        executors._trainer_cls = engine if variant == "engine" else TorchTrainer
        before, t, c = set(state.actors()), time.perf_counter(), busy_cpu_seconds()
        ray_trainer.train_on_ray(
            "cross_encoder", pairs, recipe={"model": model, "max_length": 32},
            hparams={"epochs": 1, "lr": 1e-4, "batch_size": 8, "warmup_ratio": 0.1, "seed": 1},
            resources=resources, storage_dir=work / "train", out_dir=work / "out", name=f"{variant}-{k}")
        row = {"variant": variant, "seconds": time.perf_counter() - t, "cpu_seconds": busy_cpu_seconds() - c,
               "actors": sorted(a["ActorClassName"].rsplit(".", 1)[-1]
                                for key, a in state.actors().items() if key not in before)}
        print(json.dumps(row), flush=True)
        return row

    one("engine", 0)  # warm-up: the Ray's one-off helpers (Ray Data's, Ray Train's state)
    rows = [one(variant, k) for k in range(1, args.runs + 1) for variant in ("ray-train-defaults", "engine")]
    runtime.stop_ray()
    executors._trainer_cls = engine
    return {"runs": rows}


RESULT = "log monitor result: "


def log_monitor_child(log_dir: str) -> None:
    """In a process of its own (the log monitor reads its setting when Ray starts): a local
    Ray, 60 one-call tasks, then the log monitor's CPU over a minute idle, printed as JSON."""
    import ray

    from augsbert_ray import runtime

    logs = runtime.start_ray(num_cpus=2, verbose=False, log_dir=log_dir).logs
    monitor = next(int(pid) for pid in os.listdir("/proc") if pid.isdigit() and "log_monitor" in _cmdline(pid)
                   and logs in _cmdline(pid))

    @ray.remote(num_cpus=0.1, max_calls=1)
    def task(i: int) -> int:
        print("task", i)
        return i

    ray.get([task.remote(i) for i in range(60)])
    files, c = len(os.listdir(logs)), process_cpu_seconds(monitor)
    time.sleep(60)
    result = {"log_files": files, "cpu_seconds_per_minute": process_cpu_seconds(monitor) - c}
    print(RESULT + json.dumps(result), flush=True)  # among the workers' forwarded lines
    runtime.stop_ray()


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except OSError:
        return ""


def log_monitor_part(work: Path) -> dict:
    rows = []
    for threshold in ("1000", "0"):
        env = {**os.environ, "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": threshold, "RAY_ADDRESS": ""}
        out = subprocess.run([sys.executable, __file__, "--log-monitor-child", str(work / f"lm-{threshold}")],
                             env=env, capture_output=True, text=True, timeout=900, check=True).stdout
        (result,) = [line[len(RESULT):] for line in out.splitlines() if line.startswith(RESULT)]
        row = {"threshold": threshold, **json.loads(result)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return {"runs": rows}


def report_lines(args, data: dict) -> list[str]:
    lines = ["# What a training run costs besides training", ""]
    if "training" in data:
        lines += [(f"`train_on_ray` of a tiny random cross-encoder (2 layers, 48 pairs, 6 steps) on a local Ray "
                   f"of {args.cpus} CPUs, after one warm-up run; the variants alternate, {args.runs} runs each. "
                   "CPU-seconds: the whole machine's busy time during the run."), "",
                  "| trainer | wall s (median) | CPU-s (median) | CPU-s (min-max) | actors started |",
                  "|---|---:|---:|---:|---|"]
        for variant, name in (("ray-train-defaults", "`TorchTrainer`, Ray Train's defaults"),
                              ("engine", "the engine's (`executors.trainer_class()`)")):
            rows = [r for r in data["training"]["runs"] if r["variant"] == variant]
            cpu = [r["cpu_seconds"] for r in rows]
            lines.append(f"| {name} | {np.median([r['seconds'] for r in rows]):.1f} | {np.median(cpu):.1f} | "
                         f"{min(cpu):.1f}-{max(cpu):.1f} | {', '.join(rows[-1]['actors'])} |")
        lines.append("")
    if "log-monitor" in data:
        lines += ["A local Ray after 60 one-call tasks (each a new worker process), then a minute idle:", "",
                  ("| RAY_LOG_MONITOR_MANY_FILES_THRESHOLD | scans for new log files | log files | "
                   "log monitor CPU-s per minute |"), "|---|---|---:|---:|"]
        for r in data["log-monitor"]["runs"]:
            every = "every 0.1 s (Ray's default)" if r["threshold"] != "0" else "every 0.5 s (the engine's)"
            lines.append(f"| {r['threshold']} | {every} | {r['log_files']} | {r['cpu_seconds_per_minute']:.2f} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="training runs per variant")
    p.add_argument("--cpus", type=int, default=2, help="the local Ray's CPUs (the training worker takes them all)")
    p.add_argument("--parts", nargs="+", default=["training", "log-monitor"], choices=["training", "log-monitor"])
    p.add_argument("--out", default="benchmarks/results/train_overhead")
    p.add_argument("--log-monitor-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.log_monitor_child:
        log_monitor_child(args.log_monitor_child)
        return 0

    from provenance import provenance, write_result

    data: dict = {}
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        parts = {"training": lambda: training_part(args, Path(tmp)), "log-monitor": lambda: log_monitor_part(Path(tmp))}
        for part in args.parts:
            data[part] = parts[part]()
            lines = report_lines(args, data) + provenance("benchmarks/train_overhead.py", argv)
            write_result(args.out, lines, data)  # each part's figures as soon as it has them
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
