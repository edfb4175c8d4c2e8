"""The job's progress display: bars in a terminal, plain lines elsewhere, ETAs from a fake clock."""

from __future__ import annotations

import io
import logging
import os
import pty
import re
import struct
import threading
import time

import pytest

from augsbert_ray.progress import JobProgress, format_duration

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BAR = "━"


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def tick(self, s: float) -> None:
        self.t += s


def _fake_job(p: JobProgress, clock: Clock, pause: float = 0.0) -> None:
    """A 3-stage job: 40 training steps at 2 steps/s, a reused stage, 20 steps of a second training."""
    p.plan("gold_only", total=20, unit="steps", rate_key="bi-encoder step")
    p.start_stage("cross_encoder", total=40, unit="steps", rate_key="cross-encoder step")
    clock.tick(5)  # start-up: not part of the running rate
    for step in range(1, 41):
        clock.tick(0.5)
        p.advance("cross_encoder")
        if step == 20:
            p.message("[cross_encoder] epoch 1/2 step 20/40 loss 0.1234 (16.0 pairs/s)")
        time.sleep(pause)
    p.finish_stage("cross_encoder")
    p.finish_stage("zero_shot", 12.0, reused=True)
    p.start_stage("gold_only")
    for _ in range(20):
        clock.tick(0.25)
        p.advance("gold_only")
        time.sleep(pause)
    p.finish_stage("gold_only")


def test_plain_lines_when_the_stream_is_not_a_terminal(tmp_path):
    clock, out = Clock(), io.StringIO()
    with JobProgress(["cross_encoder", "zero_shot", "gold_only"], stream=out, clock=clock, every_s=10,
                     log_path=tmp_path / "logs" / "job.log") as p:
        assert not p.interactive
        _fake_job(p, clock)
    text = out.getvalue()
    lines = text.splitlines()
    assert not ANSI.search(text)
    assert all(re.match(r"\d\d:\d\d:\d\d \S", line) for line in lines)  # every line timestamped
    body = [line[9:] for line in lines]
    assert body[0] == "[1/3] cross_encoder started"
    # progress lines at most every 10 s of the stage (20 s of steps after the first: 1 line);
    # the job's ETA: the 20 gold_only steps priced at the running 2 steps/s, zero_shot not estimated
    progress = [b for b in body if b.startswith("[1/3] cross_encoder  ")]
    assert progress == ["[1/3] cross_encoder  21/40 steps (2.0 steps/s, ETA 0:00:10, job ETA >= 0:00:20)"]
    assert "[cross_encoder] epoch 1/2 step 20/40 loss 0.1234 (16.0 pairs/s)" in body  # engine line, intact
    assert "[1/3] cross_encoder done in 0:00:25" in body
    assert "[2/3] zero_shot skipped: complete in an earlier run" in body
    # gold_only starts priced at what the cross-encoder's steps cost: 20 steps at 2.0 steps/s in
    # its loop, plus the 5 s it spent outside the loop
    assert "[3/3] gold_only started; job ETA 0:00:15 (gold_only at 2.0 steps/s + 0:00:05 start-up in cross_encoder)" \
        in body
    assert body[-1] == "[3/3] gold_only done in 0:00:05"
    log = (tmp_path / "logs" / "job.log").read_text()
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[2/3\] zero_shot skipped", log, re.M)
    assert "[cross_encoder] epoch 1/2 step 20/40 loss 0.1234" in log and "job ended after" in log


def test_job_eta_sums_the_remaining_estimates_and_names_what_is_missing():
    clock = Clock()
    p = JobProgress(["a", "b", "c", "d"], stream=io.StringIO(), clock=clock)
    p.plan("b", total=100, unit="pairs")  # no pairs measured yet
    p.plan("c", total=10, unit="steps")  # priced by a's steps
    p.plan("d", estimate_s=30)
    p.start_stage("a", total=20, unit="steps")
    clock.tick(5)  # start-up
    p.advance("a")
    clock.tick(10)
    p.advance("a", 4)  # 4 steps in 10 s since the first report: 0.4 steps/s
    eta, basis = p.job_eta()
    # a: 15 steps left / 0.4 = 37.5 s; c: 10 steps at a's running rate = 25 s; d: 30 s; b unknown
    assert eta == pytest.approx(37.5 + 25 + 30)
    assert basis["unestimated"] == ["b"]
    assert basis["rates"]["c"] == "2.5 s/step in a so far" and basis["rates"]["d"] == "as declared"
    clock.tick(37.5)
    p.advance("a", 15)
    clock.tick(2.5)  # wrap-up (say, evaluation)
    p.finish_stage("a")  # 55 s: 50 in the loop, 5 outside it
    p.start_stage("b", total=100, unit="pairs")
    eta, basis = p.job_eta()
    assert basis["unestimated"] == ["b"]  # running, but no rate yet
    # c is now priced by what a's steps cost: 10 x 2.5 s, plus a's 5 s outside its loop
    assert eta == pytest.approx(10 * 2.5 + 5 + 30)
    assert basis["rates"]["c"] == "2.5 s/step + 0:00:05 start-up in a"
    p.close()


def test_job_eta_is_the_longest_chain_when_stages_run_at_once():
    clock = Clock()
    p = JobProgress(["a", "b", "c", "d"], stream=io.StringIO(), clock=clock)
    for name, seconds in (("a", 40), ("b", 10), ("c", 25), ("d", 5)):
        p.plan(name, estimate_s=seconds)
    assert p.job_eta()[0] == pytest.approx(80)  # no graph: one after another
    p.set_graph({"a": (), "b": (), "c": ("b",), "d": ("a", "c")})  # a beside b -> c, then d
    assert p.job_eta()[0] == pytest.approx(max(40, 10 + 25) + 5)
    p.start_stage("a")
    p.start_stage("b")
    clock.tick(10)
    p.finish_stage("b")
    assert p.job_eta()[0] == pytest.approx(max(30, 25) + 5)  # two running rows, the ETA of the longer chain
    p.close()


def test_job_eta_is_a_lower_bound_until_every_stage_is_estimated():
    clock, out = Clock(), io.StringIO()
    with JobProgress(["a", "b"], stream=out, clock=clock, every_s=0) as p:
        p.start_stage("a", total=4, unit="steps")
        for _ in range(3):
            clock.tick(1)
            p.advance("a")
    assert "job ETA >= 0:00:02" in out.getvalue()  # b has no estimate
    assert "not run" not in out.getvalue()  # closing says nothing of its own about b


def test_a_stage_reported_before_it_was_started_and_a_position_that_goes_back():
    clock, out = Clock(), io.StringIO()
    with JobProgress(["train"], stream=out, clock=clock, every_s=0) as p:
        p.stage("train").set_total(10, unit="steps")
        p.stage("train").update(4)  # a worker's first report starts the stage
        clock.tick(2)
        p.stage("train").update(6)
        clock.tick(2)
        p.stage("train").update(2)  # a worker group restarted from an earlier checkpoint
        clock.tick(2)
        p.stage("train").update(4)
    lines = [line[9:] for line in out.getvalue().splitlines()]
    assert "[1/1] train  6/10 steps (1.0 steps/s, ETA 0:00:04, job ETA 0:00:04)" in lines
    assert lines[-1] == "[1/1] train  4/10 steps (1.0 steps/s, ETA 0:00:06, job ETA 0:00:06)"


def test_the_display_is_a_logging_handler_for_the_engines_lines(tmp_path):
    from augsbert_ray.progress.messages import prefixed

    out = io.StringIO()
    logger = logging.getLogger("augsbert_ray.test_progress")
    with JobProgress(["a"], stream=out, log_path=tmp_path / "job.log") as p:
        handler = p.logging_handler()
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        try:
            logger.info("[gold] pairs: train 60, dev 60, test 60")  # an engine line: shown as written
            logger.warning("[teacher_check] WARNING: the teacher is not better")  # tagged: as written
            logger.warning("faiss.shards=4 x faiss.shard_cpus=1 is more than the cluster's 2 CPUs")
            with prefixed("[auto] "):
                logger.info("[pilot] dev spearman after 20% of the steps")
            logger.debug("semantic search: 10 / 20 queries over 2 shards")  # the job log only
        finally:
            logger.removeHandler(handler)
    shown = [line[9:] for line in out.getvalue().splitlines()]
    assert [line for line in shown if not line.startswith("[1/1]") and not line.startswith("job")] == [
        "[gold] pairs: train 60, dev 60, test 60", "[teacher_check] WARNING: the teacher is not better",
        "[augsbert] WARNING: faiss.shards=4 x faiss.shard_cpus=1 is more than the cluster's 2 CPUs",
        "[auto] [pilot] dev spearman after 20% of the steps"]
    log = (tmp_path / "job.log").read_text()
    assert "[augsbert_ray.test_progress] semantic search: 10 / 20 queries" in log and "semantic" not in out.getvalue()
    assert " [gold] pairs: train 60, dev 60, test 60\n" in log


def test_bars_in_a_pseudo_terminal(tmp_path):
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    received: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    terminal = os.fdopen(slave, "w", encoding="utf-8")
    clock = Clock()
    with JobProgress(["cross_encoder", "zero_shot", "gold_only"], stream=terminal, clock=clock,
                     refresh_per_second=50, log_path=tmp_path / "job.log") as p:
        assert p.interactive  # the stream is a terminal
        _fake_job(p, clock, pause=0.005)
    terminal.close()
    reader.join(timeout=5)
    os.close(master)
    raw = b"".join(received).decode("utf-8", errors="replace")
    assert "\x1b[" in raw  # drawn, not plain lines
    # Frames are redrawn in place (carriage return, cursor up, erase line): one text line each.
    lines = [ANSI.sub("", line) for line in re.split(r"\r\n|\n|\r", raw)]
    lines = [line for line in lines if line.strip()]
    # The final frame, drawn when the display closed: every stage done, each bar full.
    final = lines[-4:]
    assert final[0].startswith("✓ [1/3] cross_encoder") and BAR * 28 in final[0] and "40/40 steps" in final[0] \
        and "done in 0:00:25" in final[0]
    assert final[1].startswith("↷ [2/3] zero_shot") and "skipped: complete in an earlier run" in final[1]
    assert final[2].startswith("✓ [3/3] gold_only") and BAR * 28 in final[2] and "20/20 steps" in final[2]
    assert final[3].strip().startswith("job") and "3/3 stages" in final[3]
    # While running: the rate and the stage's and the job's ETA.
    running = [line for line in lines if "[3/3] gold_only" in line and "steps/s" in line]
    assert running and all("ETA" in line for line in running)
    assert any(re.search(r"ETA 0:00:\d\d", line) for line in lines if line.strip().startswith("job"))
    # The engine message printed above the bars, on a line of its own, whole.
    message = "[cross_encoder] epoch 1/2 step 20/40 loss 0.1234 (16.0 pairs/s)"
    assert any(line.rstrip() == message for line in lines)
    assert not any(message in line and line.rstrip() != message for line in lines)


def test_format_duration():
    assert format_duration(0) == "0:00:00" and format_duration(3725.4) == "1:02:05"
    assert format_duration(None) == "-:--:--"


def test_the_eta_model_is_pure_and_prices_a_planned_stage_by_its_kinds_measured_cost():
    from augsbert_ray.progress.eta import DONE, RUNNING, JobModel

    m = JobModel(["a", "b"])
    m.plan("a", total=10, unit="steps")
    a = m.get("a")
    a.state, a.started, a.first_at, a.done_at_first, a.done, a.last_at = RUNNING, 0.0, 1.0, 0.0, 10.0, 11.0
    a.state, a.seconds = DONE, 15.0  # 1 step/s in its loop, 5 s besides
    m.measure(a)
    m.plan("b", total=20, unit="steps")
    eta, basis = m.job_eta(now=20.0)
    assert eta == 25.0 and basis == {"rates": {"b": "1.0 steps/s + 0:00:05 start-up in a"}, "unestimated": []}
    m.plan("c")  # a stage with no estimate: the figure becomes a lower bound that names it
    assert m.job_eta(now=20.0) == (25.0, {"rates": {"b": "1.0 steps/s + 0:00:05 start-up in a"}, "unestimated": ["c"]})


def test_a_start_paid_once_for_the_job_is_not_priced_into_the_next_stage_of_its_kind():
    from augsbert_ray.progress.eta import DONE, RUNNING, JobModel

    m = JobModel(["a", "b"])
    m.plan("a", total=10, unit="steps")
    a = m.get("a")
    a.state, a.started, a.first_at, a.done_at_first, a.done, a.last_at = RUNNING, 0.0, 1.0, 0.0, 10.0, 11.0
    a.state, a.seconds, a.one_off_s = DONE, 15.0, 4.0  # 5 s outside its loop, 4 of them starting the warm host
    m.measure(a)
    m.plan("b", total=20, unit="steps")
    assert m.job_eta(now=20.0) == (21.0, {"rates": {"b": "1.0 steps/s + 0:00:01 start-up in a"}, "unestimated": []})
