"""``augsbert bench``: what this cluster does, part by part, beside what a user would run instead.

Each part measures the engine and its in-process peer on the same hardware in the same run
(``suite.PARTS``); the pure core (``records``, ``render``, ``ceiling``) needs no Ray.

    import augsbert_ray

    report = augsbert_ray.bench("bench-out", quick=True)
    print(report.part("control-plane").data["ceiling"]["pairs_per_s"])

``augsbert_ray.bench`` is this package and the API's ``bench`` function at once: calling the
package runs ``run_bench``, as ``augsbert_ray.api.bench`` does.
"""

import sys
import types

from augsbert_ray.bench.suite import PARTS, run_bench

__all__ = ["PARTS", "run_bench"]


class _CallablePackage(types.ModuleType):
    # Importing this package binds ``augsbert_ray.bench`` to it, over any function of that name,
    # so the public ``augsbert_ray.bench(...)`` is the package itself, made callable.
    def __call__(self, *args, **kwargs):
        return run_bench(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
