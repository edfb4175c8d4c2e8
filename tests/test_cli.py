import pytest

from augsbert_ray.cli import main
from test_config import MINIMAL, write


def test_validate_ok(tmp_path, capsys):
    assert main(["validate", str(write(tmp_path, MINIMAL))]) == 0
    assert "ok" in capsys.readouterr().out


def test_validate_reports_bad_key(tmp_path, capsys):
    path = write(tmp_path, MINIMAL)
    assert main(["validate", str(path), "--set", "sampling.top_k=-1"]) == 2
    err = capsys.readouterr().err
    assert "sampling.top_k" in err and str(path) in err


def test_validate_explain_prints_each_setting_with_value_default_and_description(tmp_path, capsys):
    path = write(tmp_path, MINIMAL)
    assert main(["validate", "--explain", str(path), "sampling.top_k=7"]) == 0
    out = capsys.readouterr().out
    assert "\n[sampling]  Step 2.1" in out and "\n[sampling.faiss]" in out
    assert "\nsampling.top_k: 7  (default: 3)\n    neighbours retrieved per sentence (bm25, ss, bm25-kde)\n" in out
    assert "\nlabeling.actors: null  (default: null)  [placement]\n" in out
    assert "\nname: \"t\"  (default: required)  [placement]\n" in out
    assert main(["validate", str(path)]) == 0 and "[sampling]" not in capsys.readouterr().out


def test_run_reports_data_error_with_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("g\tf\ty\t1\t2.5\tA man.\tA dog.\ng\tf\ty\t2\tabc\tA man.\tA dog.\n")
    job = MINIMAL.replace("a.csv", str(bad)).replace("b.csv", str(bad)).replace("c.csv", str(bad))
    assert main(["run", str(write(tmp_path, job)), f"run_dir={tmp_path / 'run'}", "ray.num_cpus=1"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "label" in err


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("augsbert: error: ") and "Traceback" not in err, err
    return lines[0]


def test_validate_takes_overrides_positionally_like_run(tmp_path, capsys):
    path = write(tmp_path, MINIMAL)
    assert main(["validate", str(path), "sampling.top_k=-1"]) == 2
    assert "sampling.top_k" in _one_error_line(capsys.readouterr().err)
    assert main(["validate", str(path), "run_dir=elsewhere", "--set", "seed=3"]) == 0
    assert "run dir elsewhere" in capsys.readouterr().out


def test_validate_reports_a_section_given_twice(tmp_path, capsys):
    path = write(tmp_path, MINIMAL + "sampling: {top_k: 2}\nsampling: {top_k: 5}\n")
    assert main(["validate", str(path)]) == 2
    assert "key 'sampling' given twice in one mapping (lines 7 and 8)" in _one_error_line(capsys.readouterr().err)


def _stsb_job(tmp_path, train_text: str, **extra) -> str:
    files = {}
    for split in ("train", "dev", "test"):
        files[split] = tmp_path / f"{split}.csv"
        files[split].write_text(train_text if split == "train" else "g\tf\ty\t1\t2.5\tA man.\tA dog.\n"
                                "g\tf\ty\t2\t1.5\tA cat.\tA car.\n")
    lines = ["name: t", "data:"] + [f"  {s}: {{format: stsb, path: '{p}'}}" for s, p in files.items()]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    return str(write(tmp_path, "\n".join(lines) + "\n"))


@pytest.mark.parametrize("train", ["", "g\tf\ty\t1\t9.5\tA man.\tA dog.\n"], ids=["empty", "all-skipped"])
def test_a_job_without_training_pairs_fails_in_one_line_before_anything_is_written(tmp_path, capsys, train):
    job = _stsb_job(tmp_path, train)
    run_dir = tmp_path / "run"
    args = ["run", job, f"run_dir={run_dir}", "data.on_bad_rows=skip"]
    assert main(args) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{tmp_path / 'train.csv'}: no pairs left for training in data.train" in line
    assert not run_dir.exists()


def test_a_data_path_that_does_not_resolve_leaves_no_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write(tmp_path, MINIMAL)
    assert main(["run", str(job), "run_dir=runs/t"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"file not found: {tmp_path / 'a.csv'}" in line and f"working directory {tmp_path}" in line
    assert not (tmp_path / "runs").exists()


def test_a_pickle_only_model_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    from conftest import fake_model

    from augsbert_ray import runtime

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(runtime, "start_ray", no_ray)
    model = fake_model(tmp_path / "model", weights=("pytorch_model.bin",))
    job = _stsb_job(tmp_path, "g\tf\ty\t1\t2.5\tA man.\tA dog.\n")
    assert main(["run", job, f"run_dir={tmp_path / 'run'}", f"cross_encoder.model={model}"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "key 'cross_encoder.model'" in line and "pickles from local paths are not loaded" in line


def test_run_takes_verbose_and_the_display_counts_the_stages_the_job_runs(tmp_path):
    from augsbert_ray.api import job_stages
    from augsbert_ray.cli import _parser
    from augsbert_ray.config import load_job

    assert _parser().parse_args(["run", "job.yaml", "--verbose"]).verbose
    assert not _parser().parse_args(["run", "job.yaml"]).verbose
    cfg = load_job(write(tmp_path, MINIMAL))
    assert job_stages(cfg) == ["gold", "cross_encoder", "eval_cross_encoder", "eval_zero_shot", "gold_only",
                               "eval_gold_only", "teacher_check", "candidates", "silver", "augsbert", "eval_augsbert", "ship"]


def test_until_counts_only_the_stage_and_those_it_depends_on(tmp_path):
    from augsbert_ray.api import job_stages
    from augsbert_ray.config import load_job

    cfg = load_job(write(tmp_path, MINIMAL))
    assert job_stages(cfg, "cross_encoder") == ["gold", "cross_encoder"]
    assert job_stages(cfg, "candidates") == ["gold", "candidates"]  # BM25 reads the gold sentences only
    # Labelling waits for the teacher check, which reads both students' dev scores; the
    # zero-shot score is nobody's input.
    assert job_stages(cfg, "silver") == ["gold", "cross_encoder", "eval_cross_encoder", "gold_only", "eval_gold_only",
                                         "teacher_check", "candidates", "silver"]
    auto = load_job(write(tmp_path, MINIMAL), ["auto.enabled=true"])
    assert job_stages(auto, "auto") == ["gold", "auto"]
    assert job_stages(auto, "cross_encoder") == ["gold", "auto", "cross_encoder"]  # the choice comes first


def test_run_until_a_stage_the_job_lacks_fails_before_ray_starts(tmp_path, capsys, monkeypatch):
    from augsbert_ray import runtime

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(runtime, "start_ray", no_ray)
    job = str(write(tmp_path, MINIMAL))
    assert main(["run", job, f"run_dir={tmp_path / 'run'}", "--until", "teacher"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "no stage 'teacher'" in line and "cross_encoder, eval_cross_encoder" in line
    assert not (tmp_path / "run").exists()  # nothing was written


def test_run_without_a_job_file_says_so(capsys):
    assert main(["run"]) == 2
    assert "no job file: augsbert run JOB.yaml" in _one_error_line(capsys.readouterr().err)


def test_overrides_after_a_flag_are_overrides(tmp_path, capsys, monkeypatch):
    from augsbert_ray import cli

    seen = {}
    monkeypatch.setattr(cli, "_run", lambda cfg, address, fresh, verbose, until: seen.update(cfg=cfg, fresh=fresh) or 0)
    job = str(write(tmp_path, MINIMAL))
    assert main(["run", job, "seed=3", "--fresh", "sampling.top_k=7", "--verbose", "bi_encoder.epochs=2"]) == 0
    assert seen["fresh"] and seen["cfg"].seed == 3 and seen["cfg"].sampling.top_k == 7
    assert seen["cfg"].bi_encoder.epochs == 2
    with pytest.raises(SystemExit):
        main(["run", job, "--fresh", "stray"])  # not an override: argparse's usage error, as before
    assert "unrecognized arguments: stray" in capsys.readouterr().err


def test_warnings_reach_the_terminal_before_the_run(tmp_path, capsys, monkeypatch):
    from augsbert_ray import api

    class Started(Exception):
        pass

    monkeypatch.setattr(api, "_run_watched", lambda *a, **k: (_ for _ in ()).throw(Started()))
    job = _stsb_job(tmp_path, "g\tf\ty\t1\t2.5\tA man.\tA dog.\ng\tf\ty\t2\t1.5\tA cat.\tA car.\n")
    with pytest.raises(Started):
        main(["run", job, f"run_dir={tmp_path / 'run'}", "sampling.top_k=50"])
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("augsbert: warning: sampling.top_k=50 is not below the 4 distinct") for line in err)
    assert any("dev.csv: 2 of the 2 data.dev pairs are also training pairs" in line for line in err)


# A run that stands for one in the middle of its work: once it holds its run directory, it
# writes a file there, slowly, until it is killed (no data loaded, no Ray).
_WRITING_RUN = """
import sys, time
from unittest import mock
from augsbert_ray import preflight
from augsbert_ray.cli import main

def writing(cfg, warn=None):
    with open(sys.argv[2] + "/partial.bin", "wb") as f:
        while True:
            f.write(b"x" * 4096)
            f.flush()
            time.sleep(0.05)

with mock.patch.object(preflight, "check_job", writing):
    main(["run", sys.argv[1], "run_dir=" + sys.argv[2]])
"""


def test_two_runs_into_one_directory_the_second_refused_then_the_killed_runs_lock_taken_over(
        tmp_path, capsys, monkeypatch):
    import os
    import socket
    import subprocess
    import sys
    import time

    from augsbert_ray import preflight
    from augsbert_ray.run_lock import holder

    class Claimed(Exception):
        pass

    job = _stsb_job(tmp_path, "g\tf\ty\t1\t2.5\tA man.\tA dog.\ng\tf\ty\t2\t1.5\tA cat.\tA car.\n")
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-c", _WRITING_RUN, job, str(run_dir)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "partial.bin").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (run_dir / "partial.bin").exists(), first.stderr.read() if first.poll() is not None else "timeout"
        assert main(["run", job, f"run_dir={run_dir}"]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"run directory {run_dir} is in use by run {first.pid} on host {socket.gethostname()}" in line
    finally:
        first.kill()  # mid-write
        first.wait()
    assert holder(run_dir)["pid"] == first.pid

    def claimed(cfg, warn=None):
        assert holder(run_dir)["pid"] == os.getpid()
        raise Claimed

    monkeypatch.setattr(preflight, "check_job", claimed)
    with pytest.raises(Claimed):  # the killed run's lock is taken over
        main(["run", job, f"run_dir={run_dir}"])


_THREE_PAIRS = ("g\tf\ty\t1\t2.5\tA man.\tA dog.\ng\tf\ty\t2\t1.5\tA cat.\tA car.\n"
                "g\tf\ty\t3\t4.5\tA cow.\tA cow!\n")


@pytest.mark.parametrize("override, key", [
    ("cross_encoder.lr=inf", "cross_encoder.lr"), ("bi_encoder.lr=nan", "bi_encoder.lr"),
    ("bi_encoder.warmup_ratio=-inf", "bi_encoder.warmup_ratio"),
    ("training.checkpoint_every=nan", "training.checkpoint_every"),
    (f"seed={2**70}", "seed"), ("seed=-1", "seed"), ("bi_encoder.seed=nan", "bi_encoder.seed"),
    ("training.num_workers=64", "training.num_workers"),
    ("bi_encoder.num_layers=99", "bi_encoder.num_layers"), ("cross_encoder.max_length=100000", "cross_encoder.max_length"),
    ("labeling.num_gpus=1", "labeling.num_gpus"), ("data.subsample.dev=1", "data.subsample.dev"),
])
def test_validate_refuses_what_run_refuses_before_ray(tmp_path, capsys, monkeypatch, tiny_model, override, key):
    """Non-finite numbers, seeds past 64 bits, more training workers than the local Ray's CPUs,
    layers and positions the model lacks, a GPU this machine lacks, too few dev pairs: refused by
    ``validate`` and by ``run``, in one line, before Ray would start."""
    from augsbert_ray import runtime
    from augsbert_ray.preflight import resource_checks

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(runtime, "start_ray", no_ray)
    monkeypatch.setattr(resource_checks, "gpu_visible", lambda: False)
    monkeypatch.setattr(resource_checks, "joined_ray", lambda: False)  # as in a CLI process (not this test's)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    job = _stsb_job(tmp_path, _THREE_PAIRS, cross_encoder=f"{{model: '{tiny_model}'}}", bi_encoder=f"{{model: '{tiny_model}'}}", ray="{num_cpus: 2}")
    assert main(["validate", job]) == 0, capsys.readouterr().err  # the job itself is fine
    capsys.readouterr()
    assert main(["validate", job, override]) == 2
    refused = _one_error_line(capsys.readouterr().err)
    assert main(["run", job, override, f"run_dir={tmp_path / 'run'}"]) == 2
    assert _one_error_line(capsys.readouterr().err) == refused and key in refused
    assert not (tmp_path / "run").exists()


def test_validate_says_what_it_could_not_check(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert main(["validate", str(write(tmp_path, MINIMAL))]) == 0
    out = capsys.readouterr().out
    assert "not checked: the inputs" in out and "file not found" in out
    assert "not checked: GPUs and CPUs (the job runs on a cluster" in out
