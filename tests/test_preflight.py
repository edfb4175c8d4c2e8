"""Pre-flight: inputs, models and split sizes are checked before a job writes or starts anything."""

from __future__ import annotations

import pytest
from conftest import fake_model, write_mrpc, write_stsb

from augsbert_ray import preflight
from augsbert_ray.config import load_job, validate_tree
from augsbert_ray.errors import ConfigError, DataError
from augsbert_ray.rundir import RunDir

STSB_ROW = "main-captions\tMSRvid\t2012test\t{i:04d}\t{score}\tA man is playing {i}.\tA woman is eating {i}."


def stsb_file(path, scores, genre="main-captions"):
    path.write_text("".join(STSB_ROW.format(i=i, score=s).replace("main-captions", genre) + "\n"
                            for i, s in enumerate(scores)), encoding="utf-8")
    return path


def job(tmp_path, **data):
    files = {s: stsb_file(tmp_path / f"{s}.csv", [0.5, 2.0, 4.5, 3.0]) for s in ("train", "dev", "test")}
    tree = {"name": "t", "run_dir": str(tmp_path / "run"),
            "data": {s: {"format": "stsb", "path": str(p)} for s, p in files.items()}}
    for key, value in data.items():
        tree["data"][key] = value
    return validate_tree(tree)


def test_a_valid_job_passes_and_gets_its_splits(tmp_path):
    gold = preflight.check_job(job(tmp_path))
    assert {s: t.num_rows for s, t in gold.items()} == {"train": 4, "dev": 4, "test": 4}


@pytest.mark.parametrize("content", ["", "\n\n"], ids=["empty", "blank-lines"])
def test_an_empty_training_file_is_refused(tmp_path, content):
    cfg = job(tmp_path)
    (tmp_path / "train.csv").write_text(content)
    with pytest.raises(DataError) as info:
        preflight.check_job(cfg)
    assert str(info.value) == (f"{tmp_path / 'train.csv'}: no pairs left for training in data.train "
                               "(the file has no data rows)")


def test_a_header_only_csv_is_refused(tmp_path):
    (tmp_path / "pairs.csv").write_text("sentence1,sentence2,label\n")
    cfg = job(tmp_path, train={"format": "csv", "path": str(tmp_path / "pairs.csv")})
    with pytest.raises(DataError, match=r"pairs.csv: no pairs left for training in data.train \(the file has no data"):
        preflight.check_job(cfg)


def test_skipping_every_row_says_how_many_and_why(tmp_path):
    stsb_file(tmp_path / "bad.csv", [7.2, 9, 11])
    cfg = job(tmp_path, train={"format": "stsb", "path": str(tmp_path / "bad.csv")}, on_bad_rows="skip")
    with pytest.raises(DataError) as info:
        preflight.check_job(cfg)
    assert ("no pairs left for training in data.train (3 rows read: 3 skipped as malformed under on_bad_rows: skip "
            "(the first at line 1, field 'label': out of range [0, 5]: 7.2))") in str(info.value)


def test_genres_that_keep_nothing_are_refused(tmp_path):
    stsb_file(tmp_path / "captions.csv", [1, 2, 3])
    source = {"format": "stsb", "path": str(tmp_path / "captions.csv"), "genres": ["news"]}
    with pytest.raises(DataError, match=r"genres \['news'\] kept 0 of the 3 pairs"):
        preflight.check_job(job(tmp_path, train=source))


def test_a_header_only_mrpc_file_cannot_have_dev_carved_from_it(tmp_path):
    write_mrpc(tmp_path / "msr.txt", 0, 1)
    cfg = validate_tree({"name": "m", "task": "binary", "data": {
        "train": {"format": "mrpc", "path": str(tmp_path / "msr.txt")}, "dev": None,
        "test": {"format": "mrpc", "path": str(write_mrpc(tmp_path / "test.txt", 10, 2))}}})
    with pytest.raises(DataError, match="no pairs left for training in data.train"):
        preflight.check_job(cfg)


def test_too_few_pairs_to_carve_a_dev_split_names_how_many_are_needed(tmp_path):
    cfg = validate_tree({"name": "m", "task": "binary", "data": {
        "train": {"format": "mrpc", "path": str(write_mrpc(tmp_path / "msr.txt", 5, 1))}, "dev": None,
        "test": {"format": "mrpc", "path": str(write_mrpc(tmp_path / "test.txt", 10, 2))}}})
    with pytest.raises(DataError) as info:
        preflight.check_job(cfg)
    assert ("5 pairs are too few to carve a dev split from (data.dev is null, data.dev_fraction 0.1): that takes at "
            "least 15 training pairs, 2 for dev and one left for training") in str(info.value)


def test_carving_needs_the_fewest_pairs_that_leave_two_for_dev_and_one_for_training():
    for fraction, need in [(0.1, 15), (0.2, 8), (0.5, 3), (0.9, 5)]:
        assert preflight.carve_minimum(fraction) == need
        assert preflight.carved_dev_size(need, fraction) >= 2 and need - preflight.carved_dev_size(need, fraction) >= 1
        fewer = preflight.carved_dev_size(need - 1, fraction)
        assert fewer < 2 or fewer == need - 1  # one pair less: dev too small, or nothing left to train on


@pytest.mark.parametrize(("dev", "subsample", "message"), [
    ([2.5], {}, r"data.dev: 1 pair left; scoring a model on it needs at least 2"),
    ([2.5, 2.5, 2.5], {}, r"data.dev: all 3 pairs have the same label; Spearman's correlation needs at least two"),
    ([1, 2, 3], {"dev": 1}, r"data.dev: 1 pair left \(data.subsample.dev keeps 1\)"),
])
def test_dev_and_test_must_be_scorable(tmp_path, dev, subsample, message):
    cfg = job(tmp_path, subsample=subsample)
    stsb_file(tmp_path / "dev.csv", dev)
    with pytest.raises(DataError, match=message) as info:
        preflight.check_job(cfg)
    assert info.value.path == str(tmp_path / "dev.csv")


def test_binary_test_sets_need_both_classes(tmp_path):
    test = tmp_path / "test.csv"
    test.write_text("sentence1,sentence2,label\nA,B,1\nC,D,1\n")
    cfg = validate_tree({"name": "m", "task": "binary", "data": {
        "train": {"format": "mrpc", "path": str(write_mrpc(tmp_path / "msr.txt", 20, 1))},
        "dev": {"format": "mrpc", "path": str(write_mrpc(tmp_path / "dev.txt", 20, 3))},
        "test": {"format": "csv", "path": str(test)}}})
    with pytest.raises(DataError, match=r"data.test: all 2 pairs are positives \(label 1\); F1 .* need both classes"):
        preflight.check_job(cfg)


def test_kde_needs_two_different_training_labels(tmp_path):
    cfg = job(tmp_path, train={"format": "stsb", "path": str(stsb_file(tmp_path / "flat.csv", [3, 3, 3]))})
    preflight.check_job(cfg)  # fine for BM25
    with pytest.raises(DataError, match="KDE sampling fits a density to the training labels"):
        preflight.check_job(cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"strategy": "kde"})}))


def test_target_sets_are_checked_too(tmp_path):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("q1,q2\nsame,same\nalso,also\n")
    cfg = validate_tree({**job(tmp_path).model_dump(), "target": {
        "pairs": {"format": "csv", "path": str(pairs),
                  "columns": {"sentence1": "q1", "sentence2": "q2", "label": None}},
        "test": {"format": "mrpc", "path": str(write_mrpc(tmp_path / "t.txt", 10, 4))}, "task": "binary"}})
    with pytest.raises(DataError, match="all 2 pairs pair a sentence with itself"):
        preflight.check_job(cfg)


def test_the_splits_checked_are_the_splits_the_job_uses(tmp_path):
    """The gold stage writes exactly the splits pre-flight checked (carved, then subsampled)."""
    import pyarrow.parquet as pq

    from augsbert_ray.runner import Runner
    from augsbert_ray.stages import Gold

    write_stsb(tmp_path / "train.csv", 60, 1)
    write_stsb(tmp_path / "test.csv", 30, 2)
    cfg = validate_tree({"name": "t", "run_dir": str(tmp_path / "run"), "data": {
        "train": {"format": "stsb", "path": str(tmp_path / "train.csv")}, "dev": None, "dev_fraction": 0.3,
        "test": {"format": "stsb", "path": str(tmp_path / "test.csv")}, "subsample": {"train": 20, "dev": 9},
        "subsample_seed": 7}})
    predicted = preflight.check_job(cfg)
    done = Runner(cfg, RunDir(cfg.resolved_run_dir), lambda line: None).run(Gold())
    for split in ("train", "dev", "test"):
        used = pq.read_table(done.folder / f"{split}.parquet")
        assert predicted[split].column("line").to_pylist() == used.column("line").to_pylist(), split
    assert (used.num_rows, pq.read_table(done.folder / "dev.parquet").num_rows) == (30, 9)
    assert set(pq.read_table(done.folder / "dev.parquet").column("split").to_pylist()) == {"dev"}


# -- paths -----------------------------------------------------------------------------------
JOB_WITH_ENV = """
name: t
data:
  train: {format: stsb, path: "${AUGSBERT_DATA_DIR:-../shared/data}/stsb/sts-train.csv"}
  dev: {format: stsb, path: "${AUGSBERT_DATA_DIR:-../shared/data}/stsb/sts-dev.csv"}
  test: {format: stsb, path: "${AUGSBERT_DATA_DIR:-../shared/data}/stsb/sts-test.csv"}
"""


def test_a_relative_data_path_that_does_not_resolve_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.delenv("AUGSBERT_DATA_DIR", raising=False)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    (tmp_path / "job.yaml").write_text(JOB_WITH_ENV)
    with pytest.raises(ConfigError) as info:
        preflight.check_job(load_job(tmp_path / "job.yaml"))
    assert info.value.key == "data.train.path"
    assert str(info.value) == (
        f"{tmp_path / 'job.yaml'}: key 'data.train.path' file not found: "
        f"{tmp_path / 'shared/data/stsb/sts-train.csv'}; "
        f"the relative path '../shared/data/stsb/sts-train.csv' was resolved from the working directory "
        f"{tmp_path / 'work'}; it is built from ${{AUGSBERT_DATA_DIR:-../shared/data}} and AUGSBERT_DATA_DIR is not "
        "set, so the default '../shared/data' was used: set AUGSBERT_DATA_DIR to the folder that holds the data; "
        f"the deepest folder of it that exists is {tmp_path}")


def test_a_data_path_built_from_a_set_variable_names_its_value(tmp_path, monkeypatch):
    monkeypatch.setenv("AUGSBERT_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "job.yaml").write_text(JOB_WITH_ENV)
    expected = f"it is built from \\${{AUGSBERT_DATA_DIR}}, which is set to '{tmp_path}/data'"
    with pytest.raises(ConfigError, match=expected):
        preflight.check_job(load_job(tmp_path / "job.yaml"))


def test_a_folder_given_as_a_data_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a folder, not a file of pairs"):
        preflight.check_job(job(tmp_path, test={"format": "stsb", "path": str(tmp_path)}))


# -- models ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "weights", "message"), [
    ("cross_encoder", ("pytorch_model.bin",), "has only pickled weights (pytorch_model.bin); pickles from local "
                                              "paths are not loaded"),
    ("bi_encoder", ("pytorch_model.bin", "x/dummy.safetensors"), "has only pickled weights"),
    ("bi_encoder", ("weights.safetensors",), "no weights: needs model.safetensors"),
])
def test_a_model_folder_that_would_not_load_without_pickles_is_refused(tmp_path, key, weights, message):
    model = fake_model(tmp_path / "model", weights)
    cfg = job(tmp_path)
    cfg = cfg.model_copy(update={key: getattr(cfg, key).model_copy(update={"model": str(model)})})
    with pytest.raises(ConfigError) as info:
        preflight.check_job(cfg)
    assert info.value.key == f"{key}.model" and message in str(info.value)


def test_a_model_path_that_is_not_there_is_refused(tmp_path):
    cfg = job(tmp_path)
    cfg = cfg.model_copy(update={"bi_encoder": cfg.bi_encoder.model_copy(update={"model": "./models/nowhere"})})
    with pytest.raises(ConfigError, match=r"key 'bi_encoder.model' no such model folder: .*models/nowhere"):
        preflight.check_job(cfg)
    cfg = cfg.model_copy(update={"bi_encoder": cfg.bi_encoder.model_copy(update={"model": "org/hub-model"})})
    preflight.check_job(cfg)  # a hub id is checked when it is downloaded


@pytest.mark.parametrize(("model_type", "positions", "pad", "limit"), [
    ("bert", 130, 0, 130), ("roberta", 130, 1, 128), ("mpnet", 514, 1, 512), ("xlm-roberta", 130, None, 128)])
def test_max_length_must_fit_the_models_positions(tmp_path, model_type, positions, pad, limit):
    """RoBERTa-style encoders start their positions after the padding index: 130 positions read 128 tokens."""
    import json

    model = fake_model(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"model_type": model_type, "max_position_embeddings": positions}
                                                  | ({"pad_token_id": pad} if pad is not None else {})))
    cfg = job(tmp_path)
    for key in ("cross_encoder", "bi_encoder"):
        fits = cfg.model_copy(update={key: getattr(cfg, key).model_copy(update={"model": str(model), "max_length": limit})})
        preflight.check_job(fits)
        over = fits.model_copy(update={key: getattr(fits, key).model_copy(update={"max_length": limit + 1})})
        with pytest.raises(ConfigError, match=rf"max_length {limit + 1} is more tokens than .* at most {limit} "
                                              rf"\(max_position_embeddings {positions}") as info:
            preflight.check_job(over)
        assert info.value.key == f"{key}.max_length"


def test_models_without_absolute_positions_have_no_token_limit(tmp_path):
    import json

    from augsbert_ray.models import token_limit

    model = fake_model(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"model_type": "deberta-v2", "max_position_embeddings": 64,
                                                   "position_biased_input": False}))
    assert token_limit(model) is None
