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
