"""The seed search's decisions (``training.seed_choice``), without Ray Tune: exactly ``keep``
seeds continue, best first with ties to the smaller seed; the model is the best survivor at the
end; the cost counts the search's steps against training every seed; the audit compares the
pruning point's ranking with the final one."""

from __future__ import annotations

import math

import pytest

from augsbert_ray.training import seed_choice


def test_exactly_keep_seeds_continue_best_first_ties_to_the_smaller_seed_nan_last():
    at_prune = {7: 70.0, 3: 75.0, 5: 75.0, 1: math.nan, 9: 60.0}
    assert seed_choice.ranked(at_prune) == [3, 5, 7, 9, 1]
    assert seed_choice.survivors(at_prune, 2) == [3, 5]
    assert seed_choice.survivors(at_prune, 5) == [3, 5, 7, 9, 1]
    for keep in (0, 6):
        with pytest.raises(ValueError, match=f"keeps {keep} of 5 seeds"):
            seed_choice.survivors(at_prune, keep)


def test_the_model_is_the_best_survivor_at_the_end_not_the_best_at_the_pruning_point():
    assert seed_choice.chosen({3: 80.0, 5: 82.5}) == 5
    assert seed_choice.chosen({5: 82.5, 3: 82.5}) == 3  # a tie: the smaller seed
    fates = seed_choice.statuses([1, 3, 5, 7], continued=[3, 5], pick=5, audit=False)
    assert fates == {1: "pruned", 3: "continued", 5: "chosen", 7: "pruned"}
    assert seed_choice.statuses([1, 3], [3], 3, audit=True)[1] == "pruned (trained to the end for the audit)"


def test_the_cost_counts_the_searchs_steps_against_training_every_seed():
    # 5 seeds, 100 steps each, scored at step 20, 1 continued: 5 x 20 + 1 x 80 = 180 of 500.
    cost = seed_choice.cost([1, 2, 3, 4, 5], [3], prune=20, total=100, steps_run=180, train_seconds=90.0,
                            wall_seconds=120.0)
    assert cost["search_steps"] == 180 and cost["all_seeds_steps"] == 500
    assert cost["search_fraction"] == pytest.approx(0.36)
    assert cost["seconds_per_step"] == pytest.approx(0.5) and cost["all_seeds_seconds_estimate"] == pytest.approx(250)


def test_the_audit_says_whether_the_pruning_point_picked_the_best_seed():
    same = seed_choice.audit({1: 70.0, 2: 75.0, 3: 72.0}, {1: 80.0, 2: 85.0, 3: 82.0})
    assert same == {"rank_correlation": pytest.approx(1.0), "pick_at_prune": 2, "best_at_end": 2, "pick_is_best": True}
    wrong = seed_choice.audit({1: 75.0, 2: 70.0}, {1: 80.0, 2: 85.0})
    assert wrong["pick_at_prune"] == 1 and wrong["best_at_end"] == 2 and not wrong["pick_is_best"]
    assert wrong["rank_correlation"] == pytest.approx(-1.0)
    assert seed_choice.audit({4: 70.0}, {4: 80.0})["rank_correlation"] is None  # one seed: no ranking
