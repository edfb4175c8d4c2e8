"""A staged training set (``training.ingest``): the rows, the batches and the weights of the
same pairs held in memory, whatever the source (a table, Parquet files, a Ray Data dataset)."""

from __future__ import annotations

import math
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import make_sentence
from safetensors.torch import load_file

from augsbert_ray import schema
from augsbert_ray.stages.student import student_training_set
from augsbert_ray.training import ingest
from augsbert_ray.training.ingest import PairReader, TrainingSet, stage
from augsbert_ray.training.loop import (
    HParams,
    PairTrainer,
    length_grouped_batches,
    shard_order,
)
from augsbert_ray.training.recipes import make_recipe


def _pairs(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)

    def sentence() -> str:  # lengths that differ, and spaces the tokenisation strips
        words = " ".join(rng.choice(["very", "quite", "big", "small", "red"]) for _ in range(rng.randrange(0, 9)))
        return f"{' ' * rng.randrange(0, 2)}{make_sentence(rng)[:-1]} {words}".rstrip() + "."

    rows = [(sentence(), sentence(), rng.random()) for _ in range(n)]
    return pa.table({"sentence1": [r[0] for r in rows], "sentence2": [r[1] for r in rows],
                     "label": pa.array([r[2] for r in rows], pa.float32())})


@pytest.mark.parametrize("n", [1, 7, 1000, 65_537])
def test_the_epochs_batches_are_those_of_the_in_memory_order(n):
    # The order every training used: numpy's permutation of every row, padded by wrapping, strided
    # by rank; then chunks of `group` batches sorted by length, the batches shuffled.
    lengths = np.random.default_rng(n).integers(1, 128, size=n).astype(np.uint16)
    for world in (1, 3, 8):
        perm = np.random.default_rng([11, 2]).permutation(n)
        padded = np.resize(perm, math.ceil(n / world) * world)
        for rank in range(world):
            mine = padded[rank::world]
            np.testing.assert_array_equal(shard_order(n, 2, 11, rank, world), mine)
            chunks = [mine[i:i + 4 * 3] for i in range(0, len(mine), 4 * 3)]
            grouped = np.concatenate([c[np.argsort(lengths[c], kind="stable")] for c in chunks])
            batches = [grouped[i:i + 4] for i in range(0, len(grouped), 4)]
            expected = [batches[i] for i in np.random.default_rng([11, 2, 7]).permutation(len(batches))]
            got = length_grouped_batches(shard_order(n, 2, 11, rank, world), lengths, 4, 3, seed=11, epoch=2)
            assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_staged_files_hold_the_student_training_set_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(ingest, "ROWS_PER_BLOCK", 16)  # many blocks, a batch's rows across several
    gold, silver = _pairs(21, 1), _pairs(70, 2)
    pq.write_table(gold, tmp_path / "gold.parquet")
    pq.write_table(silver.slice(0, 40), tmp_path / "silver-0.parquet")
    pq.write_table(silver.slice(40), tmp_path / "silver-1.parquet")
    given = TrainingSet.from_files(tmp_path / "gold.parquet", [tmp_path / "silver-0.parquet",
                                                                tmp_path / "silver-1.parquet"],
                                   gold_repeat=3, silver_as_classes=True)
    expected = student_training_set(gold, silver, "binary", gold_repeat=3)
    assert given.num_rows == expected.num_rows == 133
    staged = stage(given, str(tmp_path / "staged"))
    assert staged.block == 16 and staged.rows == 133
    reader = PairReader(staged)
    idx = np.random.default_rng(0).permutation(133)[:50]  # any order, from any block
    s1, s2, labels, silver_flags = reader.fetch(idx)
    want = expected.take(pa.array(idx))
    assert s1 == want.column("sentence1").to_pylist() and s2 == want.column("sentence2").to_pylist()
    np.testing.assert_array_equal(labels, want.column("label").to_numpy().astype(np.float32))
    np.testing.assert_array_equal(silver_flags, schema.silver_flags(want))
    with pytest.raises(ValueError, match="no column label"):
        pq.write_table(gold.drop(["label"]), tmp_path / "bad.parquet")
        TrainingSet.from_files(tmp_path / "bad.parquet")


@pytest.mark.parametrize("kind,objective", [("bi_encoder", "cosent-distill"), ("cross_encoder", None)])
def test_a_streamed_training_trains_the_weights_of_the_same_pairs_in_memory(kind, objective, tiny_model, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(ingest, "ROWS_PER_BLOCK", 8)
    table = student_training_set(_pairs(8, 3), _pairs(27, 4), "regression", gold_repeat=2)
    hp = HParams(epochs=2, lr=1e-3, batch_size=16, warmup_ratio=0.1, seed=5, length_grouping=2)
    args = {"model": tiny_model, "max_length": 16, **({"objective": objective} if objective else {})}

    def train(**given):
        trainer = PairTrainer(make_recipe(kind, **args), hp=hp, name="t", **given)
        trainer.run()
        return trainer

    held = train(s1=table.column("sentence1").to_pylist(), s2=table.column("sentence2").to_pylist(),
                 labels=table.column("label").to_numpy(), silver=schema.silver_flags(table))
    reader = PairReader(stage(table, str(tmp_path / "staged")))
    streamed = train(s1=None, s2=None, labels=None, rows=reader, lengths_key={"kind": kind, **args})
    assert held.step == streamed.step == 2 * math.ceil(43 / 16)
    # The same lengths: every rank's batches, a function of them, the row count, seed, epoch, rank
    # and world alone (loop.PairTrainer._batches), are the same at any world size.
    np.testing.assert_array_equal(held.lengths, streamed.lengths)
    a, b = held.module.state_dict(), streamed.module.state_dict()
    differ = {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert a.keys() == b.keys() and not differ, differ
    assert held.stats()["final_loss"] == streamed.stats()["final_loss"]
    # The lengths were cached beside the file: a restarted worker reads them instead of tokenising again.
    assert len(list((tmp_path / "staged").glob("lengths-*.npy"))) == 1


@pytest.mark.timeout(180)
def test_a_worker_group_streams_a_ray_data_dataset_to_the_weights_of_the_in_memory_loop(ray_local, tiny_model,
                                                                                         tmp_path):
    import ray

    from augsbert_ray.training.executors import WorkerGroup
    from augsbert_ray.training.ray_trainer import WorkerResources, train_on_ray
    from augsbert_ray.training.recipes import make_recipe as recipe_of

    table = student_training_set(_pairs(6, 5), _pairs(28, 6), "regression", gold_repeat=2)
    hp = {"epochs": 2, "lr": 1e-3, "batch_size": 16, "warmup_ratio": 0.1, "seed": 3, "length_grouping": 2}
    recipe = {"model": tiny_model, "max_length": 16, "objective": "cosent-distill"}
    stats = train_on_ray("bi_encoder", TrainingSet.from_dataset(ray.data.from_arrow(table)), recipe=recipe,
                         hparams=hp, resources=WorkerResources(1, False, 1, checkpoint_every=0),
                         storage_dir=tmp_path / "ray_train", out_dir=tmp_path / "streamed", name="streamed",
                         executor=WorkerGroup(stream_above_rows=0))
    assert stats["train_pairs"] == 40 and (tmp_path / "ray_train" / "streamed-pairs" / "pairs.arrow").is_file()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker (cpus_per_worker=1): other thread counts sum in other orders
    try:
        held = PairTrainer(recipe_of("bi_encoder", **recipe), table.column("sentence1").to_pylist(),
                           table.column("sentence2").to_pylist(), table.column("label").to_numpy(), HParams(**hp),
                           silver=schema.silver_flags(table), name="held")
        held.run()
    finally:
        torch.set_num_threads(threads)
    held.recipe.save(held.module, str(tmp_path / "held"))
    a, b = load_file(tmp_path / "held" / "model.safetensors"), load_file(tmp_path / "streamed" / "model.safetensors")
    differ = {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert a.keys() == b.keys() and not differ, differ


def test_a_set_staged_in_storage_given_as_a_uri_is_read_and_its_lengths_kept_for_the_same_content(tmp_path,
                                                                                                  monkeypatch):
    from augsbert_ray import rundir

    # file:// through pyarrow's URI parsing, as s3:// would go (the project reads file:// as a path)
    monkeypatch.setattr(rundir, "is_uri", lambda location: str(location).startswith("file://"))
    folder = f"file://{tmp_path}/staged"
    table = _pairs(5, 7)
    staged = stage(table, folder)
    assert staged.location == f"{folder}/pairs.arrow" and staged.rows == 5
    s1, _, labels, silver = PairReader(staged).fetch(np.array([4, 0]))
    assert s1 == [table.column("sentence1")[4].as_py(), table.column("sentence1")[0].as_py()] and silver is None
    ingest.write_lengths(staged, {"kind": "x"}, np.array([3, 4, 5, 6, 7]))
    assert stage(table, folder).digest == staged.digest  # the same pairs: their cached lengths stay
    assert len(list((tmp_path / "staged").glob("lengths-*.npy"))) == 1
    stage(_pairs(5, 8), folder)  # other pairs: lengths of the old ones go
    assert not list((tmp_path / "staged").glob("lengths-*.npy"))


@pytest.mark.parametrize("task", ["regression", "binary"])
@pytest.mark.parametrize("curriculum", ["mixed", "silver-first"])
def test_a_students_training_sets_from_files_are_its_tables(task, curriculum, tmp_path):
    from augsbert_ray.stages.student import training_phases, training_sets

    gold, silver = _pairs(9, 7), _pairs(31, 8)
    pq.write_table(gold, tmp_path / "gold.parquet")
    pq.write_table(silver, tmp_path / "silver.parquet")
    sets = training_sets(tmp_path / "gold.parquet", tmp_path / "silver.parquet", task, 3, curriculum)
    tables = training_phases(gold, silver, task, 3, curriculum)
    assert len(sets) == len(tables) == (2 if curriculum == "silver-first" else 1)
    for given, table in zip(sets, tables):
        assert given.num_rows == table.num_rows
        assert given.to_table().equals(table)
        assert given.label_mean() == pytest.approx(float(np.mean(table.column("label").to_numpy())), rel=1e-6)
