"""Pre-flight: inputs, models and split sizes are checked before a job writes or starts anything."""

from __future__ import annotations

import pytest
from conftest import fake_model, write_mrpc, write_stsb

from augsbert_ray import preflight
from augsbert_ray.config import load_job, validate_tree
from augsbert_ray.errors import ConfigError, DataError
from augsbert_ray.loaders import job_inputs
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
    gold = preflight.check_job(job(tmp_path)).gold.tables
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
        assert job_inputs.carve_minimum(fraction) == need
        carved = job_inputs.carved_dev_size(need, fraction)
        assert carved >= 2 and need - carved >= 1
        fewer = job_inputs.carved_dev_size(need - 1, fraction)
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
    done = Runner(cfg, RunDir(cfg.resolved_run_dir)).run(Gold())
    for split in ("train", "dev", "test"):
        used = pq.read_table(done.folder / f"{split}.parquet")
        assert predicted.gold.tables[split].column("line").to_pylist() == used.column("line").to_pylist(), split
    assert (used.num_rows, pq.read_table(done.folder / "dev.parquet").num_rows) == (30, 9)
    assert set(pq.read_table(done.folder / "dev.parquet").column("split").to_pylist()) == {"dev"}


def test_the_gold_stage_writes_what_the_checks_read_and_reads_again_only_under_other_settings(tmp_path,
                                                                                              monkeypatch):
    import pyarrow.parquet as pq

    from augsbert_ray.context import JobContext
    from augsbert_ray.runner import Runner
    from augsbert_ray.stages import Gold

    cfg = job(tmp_path)
    handed = preflight.check_job(cfg)
    reads = []
    real = job_inputs.load_gold_sources
    monkeypatch.setattr(job_inputs, "load_gold_sources", lambda *a: reads.append(a) or real(*a))
    done = Runner(cfg, RunDir(cfg.resolved_run_dir), ctx=JobContext(inputs=handed)).run(Gold())
    assert reads == []  # the checks' read, written as it is
    for split in ("train", "dev", "test"):
        assert pq.read_table(done.folder / f"{split}.parquet").equals(handed.gold.tables[split]), split
    other = _with(cfg, "data", subsample={"train": 2})  # another setting: the handed read does not fit it
    again = Runner(other, RunDir(cfg.resolved_run_dir), ctx=JobContext(inputs=handed)).run(Gold())
    assert len(reads) == 1 and again.result.train == 2


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
        f"the deepest folder of it that exists is {tmp_path}; `augsbert data fetch stsb` downloads it (into "
        "$AUGSBERT_DATA_DIR, else ~/.cache/augsbert-ray/data, where the shipped jobs look)")


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


def test_a_model_path_that_is_not_there_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    cfg = job(tmp_path)
    cfg = cfg.model_copy(update={"bi_encoder": cfg.bi_encoder.model_copy(update={"model": "./models/nowhere"})})
    with pytest.raises(ConfigError, match=r"key 'bi_encoder.model' no such model folder: .*models/nowhere"):
        preflight.check_job(cfg)
    cfg = cfg.model_copy(update={"bi_encoder": cfg.bi_encoder.model_copy(update={"model": "org/hub-model"})})
    preflight.check_job(cfg)  # a hub id is checked when it is downloaded (offline: see below)


# -- what the job asks of its models and machine, known before Ray starts -------------------------
def _with(cfg, section: str, **values):
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})


def _tiny_config(folder, **config):
    """A model folder whose config.json says ``config`` (its weights and tokenizer as names only)."""
    import json

    fake_model(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", **config}))
    return str(folder)


@pytest.mark.parametrize(("section", "values", "key", "message"), [
    ("bi_encoder", {"num_layers": 10}, "bi_encoder.num_layers", r"10 layers asked for, but the model has 6 "
                                                                 r"\(num_hidden_layers in .*config.json\)"),
    ("bi_encoder", {"max_length": 4096}, "bi_encoder.max_length", r"4096 tokens is more than the model's 512 positions"),
    ("cross_encoder", {"max_length": 513}, "cross_encoder.max_length", r"513 tokens is more than the model's 512"),
])
def test_what_the_embedded_model_cannot_do_is_refused(tmp_path, section, values, key, message):
    cfg = job(tmp_path)
    preflight.check_job(_with(cfg, section, **{k: (6 if k == "num_layers" else 512) for k in values}))  # the limits
    with pytest.raises(ConfigError, match=message) as info:
        preflight.check_job(_with(cfg, section, **values))
    assert info.value.key == key and not (tmp_path / "run").exists()


def test_positions_of_a_roberta_style_model_leave_out_its_offset(tmp_path):
    model = _tiny_config(tmp_path / "m", model_type="xlm-roberta", max_position_embeddings=514, pad_token_id=1,
                         num_hidden_layers=2)
    cfg = _with(job(tmp_path), "cross_encoder", model=model, max_length=512)
    preflight.check_job(cfg)
    with pytest.raises(ConfigError, match="513 tokens is more than the model's 512 positions"):
        preflight.check_job(_with(cfg, "cross_encoder", max_length=513))


def test_a_damaged_weights_file_is_named_before_ray_starts(tmp_path):
    model = fake_model(tmp_path / "m")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(ConfigError, match=r"key 'bi_encoder.model' .*model.safetensors: truncated") as info:
        preflight.check_job(_with(job(tmp_path), "bi_encoder", model=str(model)))
    assert str(weights) in str(info.value)


def _hub_cache(root, repo: str, config: dict, weights: bytes | None = None):
    """A Hugging Face cache holding ``repo`` at one revision, as huggingface_hub lays it out."""
    import json

    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    snapshot = folder / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if weights is not None:
        (snapshot / "model.safetensors").write_bytes(weights)


def test_a_hub_id_while_the_hub_is_off_needs_a_cached_copy(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = _with(job(tmp_path), "bi_encoder", model="org/hub-model")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    preflight.check_job(cfg)  # the hub is on: checked when it is downloaded
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"key 'bi_encoder.model' hub model 'org/hub-model' is not in the local "
                                          r"Hugging Face cache .*and the hub is off"):
        preflight.check_job(cfg)
    from conftest import TINY_SAFETENSORS

    _hub_cache(tmp_path / "hub", "org/hub-model", {"num_hidden_layers": 3, "max_position_embeddings": 128},
               TINY_SAFETENSORS)
    preflight.check_job(cfg)  # cached: its config is read like a local folder's
    with pytest.raises(ConfigError, match=r"key 'bi_encoder.num_layers' 4 layers asked for, but the model has 3"):
        preflight.check_job(_with(cfg, "bi_encoder", num_layers=4))
    with pytest.raises(ConfigError, match=r"key 'bi_encoder.max_length' 129 tokens"):
        preflight.check_job(_with(cfg, "bi_encoder", max_length=129))
    _hub_cache(tmp_path / "hub2", "org/hub-model", {}, b"\0" * 3)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub2"))
    with pytest.raises(ConfigError, match=r"model.safetensors: not a safetensors file"):
        preflight.check_job(cfg)


def test_gpus_asked_for_a_local_run_need_a_gpu_here(tmp_path, monkeypatch):
    from augsbert_ray.preflight import resource_checks
    from augsbert_ray.preflight.resource_checks import asked_gpus, check_cluster_gpus, check_local_gpus

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(resource_checks, "joined_ray", lambda: False)  # another test file's Ray is not the job's
    cfg = job(tmp_path)
    assert asked_gpus(cfg) == []
    check_local_gpus(cfg, cuda_available=lambda: False)  # nothing asked
    for section, values, key in (("training", {"use_gpu": True}, "training.use_gpu"),
                                 ("labeling", {"num_gpus": 1}, "labeling.num_gpus"),
                                 ("seed_search", {"gpus_per_trial": 0.5}, "seed_search.gpus_per_trial")):
        asking = _with(cfg, section, **values)
        with pytest.raises(ConfigError, match="asks for a GPU, but this machine has no GPU that torch can use") as info:
            check_local_gpus(asking, cuda_available=lambda: False)
        assert info.value.key == key
        check_local_gpus(asking, cuda_available=lambda: True)
        check_local_gpus(_with(asking, "ray", address="10.0.0.1:6379"), cuda_available=lambda: False)  # a cluster's
        with pytest.raises(ConfigError, match=r"the Ray cluster at 10.0.0.1:6379 has none now"):
            check_cluster_gpus(asking, 0, "10.0.0.1:6379")
        check_cluster_gpus(asking, 1, "10.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    check_local_gpus(_with(cfg, "training", use_gpu=True), cuda_available=lambda: False)
    monkeypatch.delenv("RAY_ADDRESS")
    # A Ray this process joined (a script's ray.init) is the job's cluster: its GPUs are checked there.
    monkeypatch.setattr(resource_checks, "joined_ray", lambda: True)
    check_local_gpus(_with(cfg, "training", use_gpu=True), cuda_available=lambda: False)
    with pytest.raises(ConfigError, match=r"the Ray cluster this process had joined has none now"):
        check_cluster_gpus(_with(cfg, "training", use_gpu=True), 0, None)


def test_a_local_run_asking_for_a_gpu_on_a_machine_without_one_fails_before_ray(tmp_path, monkeypatch):
    from augsbert_ray.preflight import resource_checks

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(resource_checks, "gpu_visible", lambda: False)
    monkeypatch.setattr(resource_checks, "joined_ray", lambda: False)
    with pytest.raises(ConfigError, match="training.use_gpu=true asks for a GPU"):
        preflight.check_job(_with(job(tmp_path), "training", use_gpu=True))


def test_more_pilot_folds_than_training_pairs_are_refused(tmp_path):
    cfg = _with(job(tmp_path), "evaluation", pilot=True, pilot_folds=4)
    preflight.check_job(cfg)  # 4 training pairs: one per fold
    with pytest.raises(ConfigError, match=r"key 'evaluation.pilot_folds' 5 folds need at least 5 gold training pairs"
                                          r", one per fold; the job has 4"):
        preflight.check_job(_with(cfg, "evaluation", pilot_folds=5))


@pytest.mark.parametrize(("magic", "name"), [(b"\x1f\x8b\x08\x00", "gzip"), (b"BZh91AY", "bzip2"),
                                             (b"PK\x03\x04", "zip"), (b"\x28\xb5\x2f\xfd", "zstd")])
def test_a_compressed_data_file_is_named_as_compressed(tmp_path, magic, name):
    import gzip

    cfg = job(tmp_path)
    train = tmp_path / "train.csv"
    data = gzip.compress(train.read_bytes()) if name == "gzip" else magic + b"\0" * 20
    train.write_bytes(data)
    with pytest.raises(ConfigError, match=rf"key 'data.train.path' .*train.csv is {name}-compressed, not stsb text"):
        preflight.check_job(cfg)


def test_likely_mistakes_are_warned_about_not_refused(tmp_path):
    from augsbert_ray.preflight.data_warnings import data_warnings

    cfg = job(tmp_path)
    for split in ("dev", "test"):  # other sentences than train's
        path = tmp_path / f"{split}.csv"
        path.write_text(path.read_text().replace("playing", "singing"))
    assert data_warnings(cfg, preflight.check_job(cfg).gold.tables) == []
    stsb_file(tmp_path / "dev.csv", [0.5, 2.0, 4.5, 3.0])  # now the same pairs as train
    warned = []
    gold = preflight.check_job(_with(cfg, "sampling", top_k=100), warn=warned.append).gold.tables
    assert any("sampling.top_k=100 is not below the 8 distinct training sentences" in w for w in warned)
    assert any("dev.csv: 4 of the 4 data.dev pairs are also training pairs" in w for w in warned)
    rows = [STSB_ROW.format(i=i if i > 2 else 0, score=i) for i in range(6)]  # rows 1 and 2 repeat row 0
    (tmp_path / "train.csv").write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    stsb_file(tmp_path / "dev.csv", [1.0, 2.0])
    (tmp_path / "dev.csv").write_text((tmp_path / "dev.csv").read_text().replace("playing", "singing"))
    lines = data_warnings(cfg, preflight.check_job(cfg).gold.tables)
    assert lines == [f"{tmp_path / 'train.csv'}: 2 of the 6 gold training pairs repeat an earlier pair (the same two "
                     "sentences): they weigh those pairs more in training"]
    assert gold["train"].num_rows == 4


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
        with pytest.raises(ConfigError, match=rf"{limit + 1} tokens is more than the model's {limit} positions "
                                              rf"\(max_position_embeddings in ") as info:
            preflight.check_job(over)
        assert info.value.key == f"{key}.max_length"


def test_models_without_absolute_positions_have_no_token_limit(tmp_path):
    import json

    from augsbert_ray.preflight.model_checks import max_tokens

    model = fake_model(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"model_type": "deberta-v2", "max_position_embeddings": 64,
                                                   "position_biased_input": False}))
    assert max_tokens(json.loads((model / "config.json").read_text())) is None


# -- cross_encoder.train: false: the teacher labels as given -----------------------------------
@pytest.mark.parametrize(("config", "message"), [
    (None, r"the embedded MiniLM \(a sentence embedding model\) has no trained classification head"),
    ({"architectures": ["BertModel"]}, r"has no trained classification head \(no \*ForSequenceClassification "
                                       r"architecture in .*config.json\); cross_encoder.train is false"),
    ({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "1": "b", "2": "c"}},
     r"a classifier with 3 outputs .*cross_encoder.train is false"),
])
def test_a_teacher_used_as_given_needs_a_trained_one_output_head(tmp_path, config, message):
    model = "embedded" if config is None else _tiny_config(tmp_path / "m", **config)
    cfg = _with(job(tmp_path), "cross_encoder", model=model)
    preflight.check_job(cfg)  # trained by the job: a new head is what step 1 trains
    with pytest.raises(ConfigError, match=message) as info:
        preflight.check_job(_with(cfg, "cross_encoder", train=False))
    assert info.value.key == "cross_encoder.model" and not (tmp_path / "run").exists()


def test_a_trained_cross_encoder_is_used_as_given(tmp_path):
    model = _tiny_config(tmp_path / "m", architectures=["BertForSequenceClassification"], id2label={"0": "LABEL_0"})
    preflight.check_job(_with(job(tmp_path), "cross_encoder", model=model, train=False))


@pytest.mark.parametrize(("tree", "message"), [
    ({"seed_search": {"enabled": True, "targets": ["cross_encoder"]}}, "no teacher training to seed"),
    ({"auto": {"enabled": True}}, "no teacher recipe to choose"),
])
def test_a_teacher_used_as_given_refuses_what_would_train_it(tmp_path, tree, message):
    base = job(tmp_path).model_dump(mode="json")
    validate_tree({**base, **tree})  # trained: fine
    with pytest.raises(ConfigError, match=message):
        validate_tree({**base, **tree, "cross_encoder": {**base["cross_encoder"], "train": False}})


def test_a_teacher_used_as_given_is_copied_from_a_folder_or_the_hub_cache_without_pickles(tmp_path, monkeypatch):
    import json

    from huggingface_hub import constants

    from augsbert_ray.stages.teacher import copy_given_model

    config = {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "S"}}
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hub_cache(tmp_path / "hub", "org/reranker", config, weights=b"weights")
    snapshot = tmp_path / "hub" / "models--org--reranker" / "snapshots" / "abc123"
    (snapshot / "pytorch_model.bin").write_bytes(b"a pickle")
    folder = tmp_path / "folder"
    fake_model(folder)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "optimizer.pt").write_bytes(b"a pickle")
    for name, source in (("org/reranker", snapshot), (str(folder), folder)):
        out = tmp_path / "out" / name.replace("/", "_") / "model"
        out.parent.mkdir(parents=True)
        copy_given_model(name, out)
        kept = sorted(p.name for p in source.iterdir() if p.suffix not in (".bin", ".pt"))
        assert sorted(p.name for p in out.iterdir()) == kept, name
        assert (out / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
