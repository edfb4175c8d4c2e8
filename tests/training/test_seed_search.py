"""Seed search on Ray Tune with a tiny model: exactly K continue, from their checkpoints."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from conftest import make_sentence
from scipy.stats import spearmanr

from augsbert_ray.training.seed_search import SearchPlan, seed_search, total_steps

UNRELATED = ["Stock markets fell sharply on Monday.", "The senate passed the budget bill.",
             "Oil prices rose again overnight.", "Heavy rain is expected across the north."]
HPARAMS = {"epochs": 4, "lr": 1e-3, "batch_size": 8, "warmup_ratio": 0.1, "seed": 0}


def _pairs(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    s1, s2, y = [], [], []
    for i in range(n):
        a = make_sentence(rng)
        b, label = (a, 1.0) if i % 2 == 0 else (UNRELATED[rng.randrange(len(UNRELATED))], rng.random() * 0.4)
        s1.append(a), s2.append(b), y.append(label)
    return pa.table({"sentence1": s1, "sentence2": s2, "label": pa.array(y, pa.float32())})


def _search(tiny_model, tmp_path, name: str, **plan) -> dict:
    train, dev = _pairs(24, 1), _pairs(16, 2)
    return seed_search(
        "bi_encoder", train, dev, task="regression", metric="spearman",
        recipe={"model": tiny_model, "max_length": 32}, hparams=HPARAMS,
        plan=SearchPlan(**{"prune_at": 0.25, "cpus_per_trial": 1, **plan}),
        storage_dir=tmp_path / "tune", out_dir=tmp_path / name, name=name,
    ), dev


def _by_seed(record: dict) -> dict:
    return {t["seed"]: t for t in record["trials"]}


@pytest.fixture(scope="module")
def searches(ray_local, _tiny_model_master, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seed-search")
    model = str(_tiny_model_master)
    exact, dev = _search(model, tmp, "exact", seeds=[1, 2, 3], keep=1)
    audit, _ = _search(model, tmp, "audit", seeds=[1, 2, 3], keep=2, audit=True)
    return {"exact": exact, "audit": audit, "dev": dev, "tmp": tmp}


def test_steps_and_pruning_point():
    assert total_steps(24, HPARAMS) == 12  # 3 batches of 8, 4 epochs
    assert SearchPlan(seeds=[1], keep=1, prune_at=0.25).prune_step(12) == 3
    assert SearchPlan(seeds=[1], keep=1, prune_at=0.2).prune_step(12) == 3  # rounds up
    assert SearchPlan(seeds=[1], keep=1, prune_at=0.01).prune_step(12) == 1  # at least one step


def test_exactly_k_continue_from_their_checkpoints(searches):
    rec = searches["exact"]
    trials = _by_seed(rec)
    assert rec["total_steps"] == 12 and rec["prune_step"] == 3
    assert all(t["curve"][0][0] == 3 for t in trials.values())  # every seed was scored at the pruning point
    finished = [s for s, t in trials.items() if t["steps"] == 12]
    assert len(finished) == 1  # exactly K = 1 continued
    for s, t in trials.items():
        if s in finished:
            # two Tune trials: 0 -> 3, then resumed at 3 (not restarted) -> 12
            assert t["segments"] == [[0, 3], [3, 12]]
            assert [step for step, _ in t["curve"]] == [3, 12]
        else:
            assert t["segments"] == [[0, 3]] and t["steps"] == 3 and t["status"] == "pruned"
    # the survivor is the best at the pruning point (ties to the smaller seed)
    at_prune = {s: t["curve"][0][1] for s, t in trials.items()}
    assert finished == [min(at_prune, key=lambda s: (-at_prune[s], s))]
    assert rec["chosen_seed"] == finished[0] and trials[finished[0]]["status"] == "chosen"
    cost = rec["cost"]
    assert cost["search_steps"] == 3 * 3 + 1 * 9 == cost["steps_run"]
    assert cost["all_seeds_steps"] == 36 and cost["search_fraction"] == pytest.approx(0.5)


def test_chosen_model_is_the_survivor_and_scores_what_the_search_recorded(searches):
    from augsbert_ray.evaluation import cosine_scores, spearman100
    from augsbert_ray.models import load_bi_encoder

    rec, dev = searches["exact"], searches["dev"]
    st = load_bi_encoder(str(searches["tmp"] / "exact"), 32)
    pred = cosine_scores(st, dev.column("sentence1").to_pylist(), dev.column("sentence2").to_pylist())
    assert spearman100(pred, dev.column("label").to_numpy()) == pytest.approx(rec["chosen_dev"], abs=1e-3)


def test_audit_trains_every_seed_and_reports_the_rank_correlation(searches):
    rec = searches["audit"]
    trials = _by_seed(rec)
    assert all(t["steps"] == 12 and t["segments"] == [[0, 3], [3, 12]] for t in trials.values())
    at_prune = {s: t["curve"][0][1] for s, t in trials.items()}
    final = {s: t["curve"][-1][1] for s, t in trials.items()}
    kept = sorted(at_prune, key=lambda s: (-at_prune[s], s))[:2]
    statuses = {s: t["status"] for s, t in trials.items()}
    assert sorted(s for s, v in statuses.items() if v in ("continued", "chosen")) == sorted(kept)
    assert rec["chosen_seed"] == max(kept, key=lambda s: (final[s], -s))  # audit does not change the pick
    seeds = sorted(trials)
    expected = spearmanr([at_prune[s] for s in seeds], [final[s] for s in seeds]).statistic
    audit = rec["audit_result"]
    assert audit["rank_correlation"] == pytest.approx(expected)
    assert audit["pick_is_best"] == (audit["pick_at_prune"] == max(final, key=lambda s: (final[s], -s)))
    # search's would-be cost against what the audit actually ran
    assert rec["cost"]["steps_run"] == 36 and rec["cost"]["search_steps"] == 3 * 3 + 2 * 9


def test_a_seed_gives_the_same_result_twice(searches):
    exact, audit = _by_seed(searches["exact"]), _by_seed(searches["audit"])
    for s in (1, 2, 3):
        assert exact[s]["curve"][0] == audit[s]["curve"][0]  # same seed, same dev score at step 3
    chosen = searches["exact"]["chosen_seed"]
    assert exact[chosen]["curve"][-1] == audit[chosen]["curve"][-1]  # and the same after resuming
    assert len({round(t["curve"][0][1], 6) for t in exact.values()}) > 1  # seeds differ, so this can fail


def test_keep_must_not_exceed_seeds(ray_local, tiny_model, tmp_path):
    with pytest.raises(ValueError, match="keeps 4 of 3 seeds"):
        _search(tiny_model, tmp_path, "bad", seeds=[1, 2, 3], keep=4)


@pytest.mark.slow
def test_asha_option_prunes_at_the_grace_period(ray_local, tiny_model, tmp_path):
    """ASHA (asynchronous): how many survive is not fixed, but pruned seeds stop at the pruning step."""
    rec, _ = _search(tiny_model, tmp_path, "asha", seeds=[1, 2, 3, 4], keep=1, scheduler="asha")
    trials = _by_seed(rec)
    assert all(t["curve"][0][0] == 3 for t in trials.values())
    assert all(t["steps"] in (3, 12) for t in trials.values())
    survivors = [s for s, t in trials.items() if t["steps"] == 12]
    # ASHA lets a trial go on when its score at the rung is within the top 1/reduction_factor of
    # the scores recorded there before it, so how many go on depends on the order in which the
    # trials arrive; the best at the rung always goes on, and a pruned trial is never the best.
    at_rung = {s: t["curve"][0][1] for s, t in trials.items()}
    best = max(at_rung.values())
    assert any(at_rung[s] == best for s in survivors) and rec["chosen_seed"] in survivors
    assert all(at_rung[s] < best for s in trials if s not in survivors)
    assert all(t["segments"] == [[0, t["steps"]]] for t in trials.values())  # one Tune trial each, never restarted
