"""benchmarks/gpu_check.py end to end on a CPU with small sizes, so that a GPU host's minutes
never go to a bug of the script: every part runs in order, each writes its figures as it ends,
and every target is printed with its measured value and PASS or FAIL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_every_part_runs_on_a_cpu_with_small_sizes(tmp_path, data_dir):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["AUGSBERT_DATA_DIR"] = str(data_dir)
    # The stand-in for faiss, as on a GPU host without it (here faiss is installed).
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--small", "--faiss",
                           "standin", "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False, timeout=840)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["part"] for r in records] == ["end_to_end", "main_job", "labelling", "training"]
    assert all(r["error"] is None for r in records), [r["error"] for r in records]
    targets = [t for r in records for t in r["targets"]]
    assert len(targets) == 6 and all(t["value"] is not None and t["value"] > 0 for t in targets), targets
    printed = re.findall(r"^- TARGET (.+): ([\d,.]+) (\S+) \(target ([<>]=) [\d,.]+ \S+\) (PASS|FAIL)$", proc.stdout,
                         re.MULTILINE)
    assert [p[0] for p in printed] == [t["name"] for t in targets]
    assert [p[4] == "PASS" for p in printed] == [t["passed"] for t in targets]
    e2e = records[0]["data"]
    assert e2e["engine_wall_s"] > 0 and e2e["script_wall_s"] > 0
    assert set(records[3]["data"]["pairs_per_s"]) == {"16", "64"}  # --small: batches up to 64
    md = (out / "results.md").read_text()
    assert md.count("\n## ") == 4 and "jobs/stsb-1k-student2.yaml" in md


def test_a_missing_module_or_dataset_is_refused_before_any_part_runs(tmp_path):
    env = {**os.environ, "AUGSBERT_DATA_DIR": str(tmp_path / "nothing")}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--small", "--parts",
                           "main_job", "training", "--data-dir", str(tmp_path / "nothing"),
                           "--out", str(tmp_path / "o")], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 2 and "gpu_check: error: the jobs need the STS benchmark" in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()
