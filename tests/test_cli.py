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
