"""The teacher check's reading of a teacher's lead (``augsbert_ray.teacher_lead``): the measured
runs nearest the job's lead and what AugSBERT gained in them, from figures that
``benchmarks/teacher_lead.py`` keeps current with the result files."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

from augsbert_ray.teacher_lead import NEAREST, what_it_meant
from augsbert_ray.teacher_lead_data import MEASURED


def test_the_engines_copy_of_the_measurements_is_current():
    proc = subprocess.run([sys.executable, "benchmarks/teacher_lead.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_a_lead_is_read_against_the_measured_runs_nearest_it():
    spearman = sorted((p for p in MEASURED if p["metric"] == "spearman"), key=lambda p: p["lead_dev"])
    smallest = spearman[0]
    text = what_it_meant(smallest["lead_dev"], "spearman")
    near = spearman[:NEAREST]
    assert f"in {len(near)} measured runs whose teachers led by {smallest['lead_dev']:+.2f}" in text
    gains = [p["gain_test"] for p in near]
    assert f"gained {min(gains):+.2f} to {max(gains):+.2f} spearman on test" in text
    assert f"{sum(p['low'] > 0 for p in near)} of {len(near)} intervals above 0" in text
    assert what_it_meant(float("nan"), "spearman") is None and what_it_meant(5.0, "accuracy") is None


def test_a_lead_in_f1_is_read_against_f1_runs_only():
    f1 = [p for p in MEASURED if p["metric"] == "f1"]
    assert f1, "no measured F1 runs"
    text = what_it_meant(f1[0]["lead_dev"], "f1")
    near = sorted(f1, key=lambda p: abs(p["lead_dev"] - f1[0]["lead_dev"]))[:NEAREST]
    assert f"in {len(near)} measured runs" in text and " f1 on test" in text
    gains = [p["gain_test"] for p in near]
    assert f"gained {min(gains):+.2f} to {max(gains):+.2f}" in text
