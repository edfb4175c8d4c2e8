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


def test_run_reports_data_error_with_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("g\tf\ty\t1\t2.5\tA man.\tA dog.\ng\tf\ty\t2\tabc\tA man.\tA dog.\n")
    job = MINIMAL.replace("a.csv", str(bad)).replace("b.csv", str(bad)).replace("c.csv", str(bad))
    assert main(["run", str(write(tmp_path, job)), f"run_dir={tmp_path / 'run'}", "ray.num_cpus=1"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "label" in err


def test_run_takes_verbose_and_the_display_counts_the_stages_the_job_runs(tmp_path):
    from augsbert_ray.cli import _parser, job_stages
    from augsbert_ray.config import load_job

    assert _parser().parse_args(["run", "job.yaml", "--verbose"]).verbose
    assert not _parser().parse_args(["run", "job.yaml"]).verbose
    cfg = load_job(write(tmp_path, MINIMAL))
    assert job_stages(cfg) == ["cross_encoder", "zero_shot", "gold_only", "candidates", "silver", "augsbert"]
