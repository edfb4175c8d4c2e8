"""The shipped smoke job, end to end as a user runs it: real MiniLM, real STSb slice, local Ray."""

import json
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow
@pytest.mark.data
def test_smoke_job_end_to_end(tmp_path, data_dir):
    run_dir = tmp_path / "smoke"
    proc = subprocess.run(
        [sys.executable, "-m", "augsbert_ray.cli", "run", "jobs/smoke.yaml", f"run_dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=1500,
        env={**__import__("os").environ, "AUGSBERT_DATA_DIR": str(data_dir)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for title in ["Zero-shot bi-encoder", "Bi-encoder, gold only", "Cross-encoder (teacher)", "AugSBERT bi-encoder"]:
        assert title in proc.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    scores = metrics["scores"]
    # The embedded all-MiniLM-L6-v2 scores about 82 Spearman zero-shot on STSb; a broken
    # model load or pooling would land far below.
    assert scores["zero_shot"]["test"]["spearman"] > 70
    assert scores["augsbert"]["test"]["spearman"] > 60
    assert metrics["sampling"]["silver"] == metrics["sampling"]["candidates"] > 300
    assert (run_dir / "models" / "bi-encoder-augsbert" / "model.safetensors").exists()
