"""benchmarks/by_source.py: per-source scores, and a model better within every source that the
pooled score ranks lower because it places one source's pairs too high."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def by_source():
    return load_benchmark("by_source")


def test_a_shifted_source_loses_the_pooled_score_while_winning_every_source(by_source):
    rng = np.random.default_rng(0)
    n = 200
    source = np.repeat(["a 2012", "b 2016"], n)
    gold = rng.uniform(0, 1, 2 * n)
    noisy = gold + rng.normal(0, 0.3, 2 * n)  # "gold only": well placed across sources, noisy within
    better = gold + rng.normal(0, 0.1, 2 * n)  # "AugSBERT": less noisy within each source ...
    better[source == "b 2016"] += 1.0  # ... but rates every pair of one source far too high
    data = {"source": list(source), "gold": list(gold)}
    rows = by_source.by_source(data, {"gold only": noisy, "AugSBERT": better, "teacher": gold})
    per, pooled = rows[:-1], rows[-1]
    assert [r["source"] for r in rows] == ["a 2012", "b 2016", "all"]
    assert all(r["AugSBERT"] > r["gold only"] and r["gain"]["low"] > 0 for r in per)
    assert pooled["AugSBERT"] < pooled["gold only"] and pooled["gain"]["high"] < 0
    assert per[1]["AugSBERT mean"] - per[1]["gold_mean"] == pytest.approx(1.0, abs=0.05)
    assert pooled["teacher"] == pytest.approx(100.0)


def test_a_short_row_names_the_file_and_line(by_source, tmp_path, monkeypatch):
    (tmp_path / "stsb").mkdir()
    (tmp_path / "stsb" / "sts-dev.csv").write_text(
        "main-news\theadlines\t2015\t0001\t2.0\tA man.\tA man.\nmain-news\theadlines\t2015\t0002\t3.0\n",
        encoding="utf-8")
    monkeypatch.setenv("AUGSBERT_DATA_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match=r"sts-dev\.csv, line 2: 5 fields"):
        by_source.read_split("dev")
