"""What a job pays once before its first training: the local Ray's start and the first warm host's.

Each round runs in a new process, as a job's driver does: the engine's ``start_ray`` (a local
Ray, as ``augsbert run`` starts it), then one warm host from the job's pool
(``augsbert_ray.workers``) taken for a no-op, which is what the first training stage waits
for. Both phases report their wall time and the machine's busy CPU-seconds over it (from
/proc/stat, niced Ray workers included), so that the idle share of the cores shows. Then the
host's own imports are timed alone, in a fresh interpreter with ``python -X importtime``,
split by the packages that take longest.

    python benchmarks/host_start.py --rounds 3 --out benchmarks/results/host_start_cpu
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from os import cpu_count

from augsbert_ray.workers import WARM_IMPORTS

# A warm host's imports, in its order: each top-level line of the report is what that package
# adds to those before it.
LAYERS = WARM_IMPORTS
INSIDE = ("sklearn", "pandas")  # loaded by sentence-transformers (sklearn.metrics), reported where they load
PACKAGES = LAYERS + INSIDE


def busy_cpu_seconds() -> float:
    """user + nice + system over every core since boot (Ray's workers run niced)."""
    with open("/proc/stat", encoding="ascii") as f:
        user, nice, system = map(int, f.readline().split()[1:4])
    return (user + nice + system) / 100


def one_round() -> dict:
    """In this process: Ray's start, then the first warm host's; prints the figures as JSON."""
    b0, t0 = busy_cpu_seconds(), time.time()
    import ray

    from augsbert_ray.runtime import start_ray, stop_ray
    from augsbert_ray.workers import HostPool

    start_ray(None, None, verbose=False)
    b1, t1 = busy_cpu_seconds(), time.time()
    pool = HostPool()
    with pool.acquire(1, 0, "a no-op") as host:
        ray.get(host.call.remote(int))
        host_seconds = pool.start_seconds(host)
    b2, t2 = busy_cpu_seconds(), time.time()
    pool.close()
    stop_ray()
    return {"ray_start_s": t1 - t0, "ray_start_busy_cpu_s": b1 - b0, "host_start_s": t2 - t1,
            "host_reported_s": host_seconds, "host_start_busy_cpu_s": b2 - b1}


def import_breakdown() -> dict:
    """The host's imports in a fresh interpreter (Ray already imported, as in a Ray worker):
    ``parse_importtime`` of its report."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "; ".join(f"import {m}" for m in ("ray", *LAYERS))],
                         capture_output=True, text=True, check=True).stderr
    return parse_importtime(out)


def parse_importtime(out: str) -> dict:
    """``-X importtime``'s report -> seconds: the total of ``LAYERS``, each layer's own top-level
    line, and each of ``INSIDE`` where it first loaded (None where absent)."""
    rows = []
    for line in out.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((m.group(3), len(m.group(2)), int(m.group(1)) / 1e6))
    top = {name: s for name, indent, s in rows if indent == 1}  # what each top-level import added
    inside = {}
    for name, _, seconds in rows:
        inside.setdefault(name, seconds)  # a module's cumulative time where it loaded
    total = sum(top.get(p, 0.0) for p in LAYERS)
    return {"total_s": total, **{p: top.get(p) for p in LAYERS}, **{p: inside.get(p) for p in INSIDE}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/host_start")
    p.add_argument("--round", action="store_true", help=argparse.SUPPRESS)  # one round, in its own process
    args = p.parse_args()
    if args.round:
        print(json.dumps(one_round()))
        return 0
    from provenance import provenance, write_result

    rounds, imports = [], []
    for i in range(args.rounds):
        done = subprocess.run([sys.executable, __file__, "--round"], capture_output=True, text=True, check=True)
        rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
        imports.append(import_breakdown())
        print(f"round {i + 1}: {rounds[-1]}; imports {imports[-1]['total_s']:.2f} s", flush=True)
    lines = ["# A job's one-off start: the local Ray, then its first warm host", "",
             "Each round a new process: the engine's `start_ray` (a local Ray), then one warm host taken from the "
             "job's pool for a no-op (what the first training stage waits for). Busy CPU-seconds: the whole "
             "machine's, from /proc/stat, over the phase; the cores' capacity over it is wall time x cores.", "",
             "| round | Ray's start, s | busy CPU-s | first warm host, s | busy CPU-s | host's imports alone, s |",
             "|---:|---:|---:|---:|---:|---:|"]
    for i, (r, m) in enumerate(zip(rounds, imports), 1):
        lines.append(f"| {i} | {r['ray_start_s']:.2f} | {r['ray_start_busy_cpu_s']:.2f} of "
                     f"{r['ray_start_s'] * cpu_count():.2f} | {r['host_start_s']:.2f} | "
                     f"{r['host_start_busy_cpu_s']:.2f} of {r['host_start_s'] * cpu_count():.2f} | {m['total_s']:.2f} |")
    lines += ["", "The host's imports alone (`python -X importtime`, a fresh interpreter with Ray imported; "
              "what each package adds to those above it; scikit-learn and pandas are part of sentence-transformers' line, "
              "loaded by it; per round):", "",
              "| package | " + " | ".join(f"round {i}" for i in range(1, len(imports) + 1)) + " |",
              "|---|" + "---:|" * len(imports)]
    for pkg in PACKAGES:
        lines.append(f"| `{pkg}` | " + " | ".join("-" if m[pkg] is None else f"{m[pkg]:.2f}" for m in imports) + " |")
    lines += ["", *provenance("benchmarks/host_start.py", None)]
    write_result(args.out, lines, {"rounds": rounds, "imports": imports})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
