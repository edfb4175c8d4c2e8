"""augsbert-ray: Augmented SBERT (Thakur et al., NAACL 2021) on Ray.

A cross-encoder trained on a small gold set labels sampled sentence pairs ("silver"),
and a bi-encoder trains on gold + silver. See README.md and ``augsbert --help``.

The Python API (``augsbert_ray.api``) does what the CLI's verbs do::

    import augsbert_ray

    metrics = augsbert_ray.run(augsbert_ray.load_job("jobs/smoke.yaml"))
    summary = augsbert_ray.label("runs/smoke/models/cross-encoder", "pairs.parquet", "scored/")
    report = augsbert_ray.bench("bench-out", quick=True)
"""

__version__ = "0.1.0"
__all__ = ["load_job", "run", "label", "bench"]


def __getattr__(name: str):
    # Imported on first use, so that ``import augsbert_ray`` (and the CLI's start) stays fast.
    if name == "bench":
        # ``augsbert_ray.bench`` is also the benchmark package, which Python binds to this name once
        # it is imported; the package is callable (``api.bench``), so the name means one thing always.
        import augsbert_ray.bench as package

        return package
    if name in __all__:
        from augsbert_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'augsbert_ray' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
