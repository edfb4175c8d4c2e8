"""An optional module a command's settings need is checked before Ray starts (the module made
unimportable in-process), and an error a stage did not foresee is one line on the terminal,
its traceback in the job log."""

from __future__ import annotations

import sys
import time

import pytest
from test_cli import _one_error_line, _stsb_job

from augsbert_ray import runtime
from augsbert_ray.cli import main
from augsbert_ray.config import load_job
from augsbert_ray.preflight import optional_modules

GOLD = "g\tf\ty\t1\t2.5\tA man plays.\tA dog runs.\ng\tf\ty\t2\t1.5\tA cat sits.\tA car drives.\n"


@pytest.fixture
def no_ray(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(runtime, "start_ray", refuse)


@pytest.mark.parametrize(("overrides", "key"), [
    (["sampling.strategy=bm25+ss"], "sampling.strategy"),
    (["sampling.strategy=ss"], "sampling.strategy"),
    (["auto.enabled=true"], "auto.strategies"),  # the autopilot's default grid tries bm25+ss
])
def test_a_job_that_searches_with_faiss_without_it_stops_in_one_line(tmp_path, capsys, monkeypatch, no_ray,
                                                                     overrides, key):
    monkeypatch.setitem(sys.modules, "faiss", None)
    run_dir = tmp_path / "run"
    t0 = time.perf_counter()
    assert main(["run", _stsb_job(tmp_path, GOLD), f"run_dir={run_dir}", *overrides]) == 2
    assert time.perf_counter() - t0 < 30
    line = _one_error_line(capsys.readouterr().err)
    assert f"key '{key}'" in line and "faiss is not installed" in line
    assert 'pip install "augsbert-ray[cpu]" (or "augsbert-ray[gpu]" on a GPU host)' in line
    assert not run_dir.exists()


def test_a_hub_dataset_without_datasets_stops_naming_the_hub_extra(tmp_path, capsys, monkeypatch, no_ray):
    monkeypatch.setitem(sys.modules, "datasets", None)
    run_dir = tmp_path / "run"
    job = _stsb_job(tmp_path, GOLD)
    override = "data.test={format: hf, path: mteb/stsbenchmark-sts, hf_split: test, label_range: [0, 5]}"
    assert main(["run", job, f"run_dir={run_dir}", override]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "key 'data.test.format'" in line and 'datasets is not installed: pip install "augsbert-ray[hub]"' in line
    assert not run_dir.exists()


def test_what_needs_faiss_and_what_does_not(tmp_path):
    from augsbert_ray.candidates import EMBEDS

    assert optional_modules.FAISS_STRATEGIES == EMBEDS
    job = _stsb_job(tmp_path, GOLD)
    for strategy in ("bm25", "rs", "kde", "bm25-kde"):  # KDE draws random pairs and fits scipy's density
        assert optional_modules.job_needs(load_job(job, [f"sampling.strategy={strategy}"])) == []
    target = ("target={pairs: {format: stsb, path: '%s', columns: {label: null}}, test: {format: stsb, path: '%s'}}"
              % (tmp_path / "dev.csv", tmp_path / "test.csv"))
    # target pairs are labelled as they are: no sampling, so no search
    assert optional_modules.job_needs(load_job(job, ["sampling.strategy=ss", target])) == []


@pytest.mark.parametrize(("part", "module", "why", "extra"), [
    ("bm25", "bm25s", "measures its peer, bm25s", "bench"),
    ("training", "datasets", "measures its peer, SentenceTransformer.fit, which needs datasets", "bench"),
    ("training", "accelerate", "measures its peer, SentenceTransformer.fit, which needs accelerate", "bench"),
    ("semantic", "faiss", "searches the engine's Faiss indexes", "cpu"),
])
def test_bench_stops_before_ray_when_a_part_lacks_its_module(tmp_path, capsys, monkeypatch, no_ray, part, module,
                                                           why, extra):
    # the bench extra is not part of the test install: every other module is taken as installed
    monkeypatch.setattr(optional_modules, "installed", lambda m: m != module)
    monkeypatch.setitem(sys.modules, module, None)
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--parts", "labelling", part, "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"augsbert: error: --parts: the {part} part {why}") and f"{module} is not installed" in line
    assert f'pip install "augsbert-ray[{extra}]"' in line
    assert not out.exists()


def test_installed_sees_a_module_made_unimportable(monkeypatch):
    assert optional_modules.installed("json")
    monkeypatch.setitem(sys.modules, "json", None)
    assert not optional_modules.installed("json")
    assert not optional_modules.installed("no_such_module_here.sub")


# -- an error no check foresaw --------------------------------------------------------------
def test_an_unforeseen_error_in_a_stage_is_one_line_naming_the_stage_and_the_log(tmp_path, capsys, monkeypatch,
                                                                                  no_ray):
    from augsbert_ray.stages.gold import Gold

    def fail(self, inputs, params, env):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(Gold, "run", fail)
    run_dir = tmp_path / "run"
    job = _stsb_job(tmp_path, GOLD)
    assert main(["run", job, f"run_dir={run_dir}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    log = run_dir / "logs" / "job.log"
    assert err.strip().splitlines()[-1] == (f"augsbert: error: stage 'gold' failed: RuntimeError: disk on fire; the "
                                            f"full traceback is in {log} (--verbose shows it here)")
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in fail" in text and "second line" in text

    with pytest.raises(RuntimeError, match="disk on fire"):  # --verbose: the traceback itself
        main(["run", job, f"run_dir={run_dir}", "--verbose"])
