"""summary.md of unfinished runs: written after every stage, before later stages' results exist."""

from augsbert_ray.metrics import RunMetrics
from augsbert_ray.report import summary_markdown


def _target_run(data: dict, sampling: dict) -> RunMetrics:
    return RunMetrics(job="da", task="binary", primary_metric="f1", run_dir="runs/da", complete=False,
                      data={"train": 40, "dev": 20, "test": 20, "skipped_rows": 0},
                      sampling=sampling,
                      target={"task": "binary", "metric": "auc_0.05", "data": data, "mix_source_gold": False,
                              "candidates": {}})


def test_a_domain_adaptation_summary_before_the_target_sets_are_loaded():
    text = summary_markdown(_target_run({}, {}))
    assert "(unfinished run)" in text and "Domain adaptation" not in text


def test_a_corpus_summary_before_its_pairs_are_labelled_and_after():
    data = {"test": {"pairs": 30}}
    before = summary_markdown(_target_run(data, {"strategy": "bm25", "sentences": 40, "candidates": 14}))
    assert "on 30 target test pairs. Silver: target corpus pairs, not labelled yet (target silver only)." in before
    after = summary_markdown(_target_run(data, {"strategy": "bm25", "sentences": 40, "candidates": 14, "labelled": 14, "silver": 12}))
    assert "Silver: 12 bm25 pairs of 40 target corpus sentences labelled by the cross-encoder" in after


def test_the_density_plot_is_never_seen_half_written(tmp_path, monkeypatch):
    # `augsbert report` on a running job lists the plots: each appears whole, by a rename.
    import os

    from augsbert_ray import report

    target = tmp_path / "silver_density.png"
    target.write_bytes(b"an earlier run's plot")
    renames = []
    real_replace = os.replace

    def replace(src, dst):
        assert target.read_bytes() == b"an earlier run's plot"  # untouched until the new one is whole
        renames.append((os.path.basename(src), os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(report.os, "replace", replace)
    report.write_density_plot(target, [0.1, 0.5, 0.9], [0.2, 0.4], "t")
    assert renames == [(".silver_density.png.tmp", "silver_density.png")]
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in tmp_path.iterdir()] == [target.name]
