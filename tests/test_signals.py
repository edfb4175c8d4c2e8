"""Ctrl-C and SIGTERM end a job the same way wherever they arrive (``signals``)."""

import os
import signal
import time

import pytest

from augsbert_ray import signals


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_raises_interrupted_and_the_handlers_are_put_back(signum, status):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as info:
        with signals.handled():
            assert signals.active()
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises in here
    assert signals.exit_status(info.value) == status
    assert signals.exit_status(KeyboardInterrupt()) == status  # what Ray's ray.get may raise instead
    assert signal.getsignal(signal.SIGTERM) is before and not signals.active()


def test_ray_inits_own_sigterm_exit_becomes_an_interruption():
    from augsbert_ray.runtime.cluster import _interrupted

    assert isinstance(_interrupted(SystemExit(signal.SIGTERM), ours=True), signals.Interrupted)
    other = SystemExit(3)
    assert _interrupted(other, ours=True) is other and _interrupted(SystemExit(15), ours=False).code == 15


def test_ray_train_does_not_take_ctrl_c_over():
    import importlib.util
    from pathlib import Path

    from augsbert_ray.runtime.ray_private import JobOwnsCtrlC as _JobOwnsCtrlC

    # The hook is still Ray Train's (read, not imported: importing Ray Train takes seconds).
    ray_dir = Path(importlib.util.find_spec("ray").origin).parent
    source = (ray_dir / "train" / "v2" / "api" / "data_parallel_trainer.py").read_text(encoding="utf-8")
    assert "def _register_sigint_handler(self, controller" in source

    class RayTrainer:  # what Ray Train's fit does with the hook
        def _register_sigint_handler(self, controller):
            signal.signal(signal.SIGINT, lambda signum, frame: None)

    class Trainer(_JobOwnsCtrlC, RayTrainer):
        pass

    with signals.handled():
        Trainer()._register_sigint_handler(controller=None)
        assert signal.getsignal(signal.SIGINT) is signals._on_signal
    with signals.handled():  # the test fails without the override
        RayTrainer()._register_sigint_handler(controller=None)
        assert signal.getsignal(signal.SIGINT) is not signals._on_signal



def _tiny_job(tmp_path) -> str:
    from test_config import write

    rows = "g\tf\ty\t1\t2.5\tA man.\tA dog.\ng\tf\ty\t2\t1.5\tA cat.\tA car.\ng\tf\ty\t3\t4.0\tA cow.\tA cup.\n"
    (tmp_path / "s.csv").write_text(rows)
    path = str(tmp_path / "s.csv")
    return str(write(tmp_path, "name: t\ndata:\n" + "".join(
        f"  {s}: {{format: stsb, path: '{path}'}}\n" for s in ("train", "dev", "test"))))


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_before_ray_ends_the_run_with_one_line_and_frees_the_run_directory(
        tmp_path, capsys, monkeypatch, signum, status):
    from augsbert_ray import preflight
    from augsbert_ray.cli import main

    def checks(cfg, warn=None):
        os.kill(os.getpid(), signum)
        time.sleep(5)

    monkeypatch.setattr(preflight, "check_job", checks)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["run", _tiny_job(tmp_path), f"run_dir={tmp_path / 'run'}"]) == status
    assert capsys.readouterr().err.strip().splitlines() == ["augsbert: interrupted"]
    assert not (tmp_path / "run").exists() and signal.getsignal(signal.SIGTERM) is before


def test_sigterm_while_ray_connects_is_an_interruption_not_rays_exit_15(monkeypatch):
    import sys

    import ray

    from augsbert_ray import runtime

    def connecting(**kwargs):  # what ray.init does: its own SIGTERM handler, then a wait
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(ray, "init", connecting)
    # start_ray connects only when this process has no Ray yet: an earlier test may have left one
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with signals.handled(), pytest.raises(signals.Interrupted) as info:
        runtime.start_ray("127.0.0.1:6379")
    assert signals.exit_status(info.value) == 143
