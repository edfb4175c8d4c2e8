"""``augsbert bench``: what this cluster does, part by part, beside what a user would run instead.

Each part measures the engine and its in-process peer on the same hardware in the same run
(``suite.PARTS``); the pure core (``records``, ``render``, ``ceiling``) needs no Ray.

    from augsbert_ray.bench import run_bench

    report = run_bench("bench-out", quick=True)
    print(report.part("control-plane").data["ceiling"]["pairs_per_s"])
"""

from augsbert_ray.bench.suite import PARTS, run_bench

__all__ = ["PARTS", "run_bench"]
