"""``augsbert_ray.bench``, the Python API of ``augsbert bench``, and the verb as a thin layer over it. No Ray."""

from __future__ import annotations

import sys

import pytest

import augsbert_ray
from augsbert_ray.errors import ConfigError


def test_bench_is_exported_and_is_the_benchmark_package_whichever_is_imported_first():
    assert "bench" in augsbert_ray.__all__
    bench = augsbert_ray.bench
    assert bench is sys.modules["augsbert_ray.bench"] and callable(bench)
    assert bench.PARTS == ("labelling", "bm25", "semantic", "training", "control-plane")


def test_an_unknown_part_is_refused_naming_the_valid_ones_before_anything_is_written(tmp_path):
    out = tmp_path / "bench-out"
    with pytest.raises(ConfigError, match=r"gpu-melting.*valid: labelling, bm25, semantic, training, control-plane"):
        augsbert_ray.bench(out, quick=True, parts=["bm25", "gpu-melting"])
    with pytest.raises(ConfigError, match="none given"):
        augsbert_ray.bench(out, parts=[])
    assert not out.exists()


def test_the_verb_passes_its_options_to_the_api(monkeypatch, tmp_path):
    from augsbert_ray import api
    from augsbert_ray.bench.records import BenchReport, PartResult
    from augsbert_ray.cli import main

    calls = []

    def fake(out, **options):
        calls.append((out, options))
        return BenchReport(mode="quick", command=options["command"], started="now",
                           parts=[PartResult("bm25", "BM25", status="failed", error="x")])

    monkeypatch.setattr(api, "bench", fake)
    rc = main(["bench", "--quick", "--parts", "bm25", "semantic", "--out", str(tmp_path), "--model", "m"])
    (out, options), = calls
    assert rc == 1  # a failed part fails the verb
    assert out == str(tmp_path) and options["quick"] and options["parts"] == ["bm25", "semantic"]
    assert options["model"] == "m" and options["command"].startswith("augsbert bench --quick")
