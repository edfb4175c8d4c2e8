"""The shipped smoke job, end to end as a person runs it: `augsbert run` in a terminal (a
pseudo-terminal), the real MiniLM, a real STSb slice, a local Ray. The job's slice is made
smaller on the command line, as a person would for a first look (100 pairs per split, one
teacher epoch): what is checked is that every stage runs with the embedded model and what
the person sees, not the scores' precision.

What the person sees is checked, not only what the job writes: the stage list, every bar
finished, none of Ray's own messages, and the summary table at the end; then
`augsbert report` prints the same summary again.
"""

import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import time

import pytest

from conftest import REPO

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][AB0-2]|\x1b[=>]")
# Ray's own messages a person used to see (Ray Data's progress blocks, Ray Train's
# checkpoint and report lines, actor warnings, the token notice).
RAY_NOISE = ["Active & requested resources", "Queued blocks", "Checkpoint successfully created",
             "Reporting training result", "has constructor arguments", "Token authentication",
             "multiple active Ray instances", "logging_progress", "streaming_executor"]

SMALLER = ["data.subsample.train=100", "data.subsample.dev=100", "data.subsample.test=100", "cross_encoder.epochs=1"]


def _run_in_terminal(args: list[str], env: dict, timeout: float) -> tuple[int, str]:
    """Runs a command with a pseudo-terminal (120 columns) as its stdout and stderr; returns
    its exit status and everything it wrote."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the job did not finish in time:\n" + b"".join(chunks).decode(errors="replace")[-3000:])
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other side closed: the process ended
                data = b""
            if not data and proc.poll() is not None:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(), b"".join(chunks).decode("utf-8", errors="replace")


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.timeout(1500)
def test_smoke_job_in_a_terminal(tmp_path, data_dir):
    run_dir = tmp_path / "smoke"
    env = {**os.environ, "AUGSBERT_DATA_DIR": str(data_dir), "TERM": "xterm-256color", "COLUMNS": "120"}
    rc, raw = _run_in_terminal([sys.executable, "-m", "augsbert_ray.cli", "run", "jobs/smoke.yaml",
                                f"run_dir={run_dir}", *SMALLER], env, timeout=1400)
    text = ANSI.sub("", raw)
    assert rc == 0, text[-4000:]
    assert "\x1b[" in raw  # a terminal gets the drawn display, not plain lines
    lines = [line.rstrip() for line in re.split(r"\r\n|\n|\r", text) if line.strip()]
    # Every stage in the list, and in the last frame every one done with its bar full.
    stages = ["gold", "cross_encoder", "eval_cross_encoder", "eval_zero_shot", "gold_only", "eval_gold_only",
              "teacher_check", "candidates", "silver", "augsbert", "eval_augsbert", "ship"]
    for i, name in enumerate(stages, 1):
        frames = [line for line in lines if f"[{i}/{len(stages)}] {name}" in line]
        assert frames, name
        assert any(line.startswith("✓") and "done in" in line for line in frames), (name, frames[-1])
    assert any("12/12 stages" in line for line in lines if line.strip().startswith("job"))
    assert any(re.search(r"\d+/\d+ steps", line) for line in lines if "gold_only" in line)  # a bar with its unit
    # None of Ray's own messages reach the person; they are in the run's log.
    for noise in RAY_NOISE:
        assert noise not in text, noise
    assert (run_dir / "logs" / "ray.log").stat().st_size > 0 and (run_dir / "logs" / "job.log").exists()
    # The summary at the end, as summary.md has it.
    summary = (run_dir / "summary.md").read_text()
    for title in ["Zero-shot bi-encoder", "Bi-encoder, gold only", "Cross-encoder (teacher)", "AugSBERT bi-encoder"]:
        assert title in summary
        row = next(line for line in summary.splitlines() if line.startswith(f"| {title}"))
        assert row in text
    metrics = json.loads((run_dir / "metrics.json").read_text())
    scores = metrics["scores"]
    # The embedded all-MiniLM-L6-v2 scores about 82 Spearman zero-shot on STSb; a broken
    # model load or pooling would land far below.
    assert scores["zero_shot"]["test"]["spearman"] > 70
    assert scores["augsbert"]["test"]["spearman"] > 60
    assert metrics["sampling"]["silver"] == metrics["sampling"]["candidates"] > 200
    assert (run_dir / "models" / "bi-encoder-augsbert" / "model.safetensors").exists()
    # And again, later: augsbert report prints the same summary and lists the plot.
    again = subprocess.run([sys.executable, "-m", "augsbert_ray.cli", "report", str(run_dir)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and summary in again.stdout and "silver_density.png" in again.stdout
