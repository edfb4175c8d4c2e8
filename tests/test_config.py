from pathlib import Path

import pytest

from augsbert_ray.config import apply_overrides, dump_job, load_job, parse_override, validate_tree
from augsbert_ray.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
JOB_FILES = sorted((REPO / "jobs").glob("*.yaml"))

MINIMAL = """
name: t
data:
  train: {format: stsb, path: a.csv}
  dev: {format: stsb, path: b.csv}
  test: {format: stsb, path: c.csv}
"""


def write(tmp_path, text, name="job.yaml"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize("path", JOB_FILES, ids=[p.name for p in JOB_FILES])
def test_every_shipped_job_validates(path):
    cfg = load_job(path)
    assert cfg.name == path.stem
    header = path.read_text(encoding="utf-8").splitlines()[0]
    assert header.startswith("# "), "a job file opens with a comment saying what it does"
    assert "augsbert run jobs/" in path.read_text(encoding="utf-8"), "and how to launch it"


def test_minimal_job_gets_defaults(tmp_path):
    cfg = load_job(write(tmp_path, MINIMAL))
    assert cfg.sampling.strategy == "bm25" and cfg.sampling.top_k == 3
    assert cfg.cross_encoder.model == "embedded"
    assert str(cfg.resolved_run_dir) == "runs/t"


def test_unknown_key_names_file_and_key(tmp_path):
    path = write(tmp_path, MINIMAL + "bi_encoder: {epochz: 2}\n")
    with pytest.raises(ConfigError) as e:
        load_job(path)
    assert e.value.key == "bi_encoder.epochz"
    assert str(path) in str(e.value)


def test_invalid_value_names_key(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_job(write(tmp_path, MINIMAL), ["bi_encoder.epochs=0"])
    assert e.value.key == "bi_encoder.epochs"
    assert "greater than 0" in e.value.reason


@pytest.mark.parametrize("override,key", [
    ("sampling.top_k=true", "sampling.top_k"), ("cross_encoder.epochs=true", "cross_encoder.epochs"),
    ("bi_encoder.num_layers=yes", "bi_encoder.num_layers"), ("cross_encoder.lr=off", "cross_encoder.lr"),
    ("auto.top_k=[3, true]", "auto.top_k"), ("data.train.label_range=[true, 5]", "data.train.label_range"),
    ("auto.teacher_recipes=[[4, true]]", "auto.teacher_recipes"), ("seed_search.seeds=true", "seed_search.seeds"),
])
def test_a_boolean_never_stands_for_a_number(tmp_path, override, key):
    path = write(tmp_path, MINIMAL)
    with pytest.raises(ConfigError) as e:
        load_job(path, [override])
    assert e.value.key == key and ("is a boolean" in e.value.reason or "holds a boolean" in e.value.reason)
    assert str(path) in str(e.value)


def test_numbers_as_users_write_them_still_load(tmp_path):
    cfg = load_job(write(tmp_path, MINIMAL + "cross_encoder: {lr: 1e-4, epochs: 2}\n"),
                   ["bi_encoder.lr=3e-5", "training.use_gpu=false", "sampling.top_k=4", "auto.top_k=[3, 5]"])
    assert cfg.cross_encoder.lr == 1e-4 and cfg.bi_encoder.lr == 3e-5 and cfg.sampling.top_k == 4
    assert cfg.training.use_gpu is False and cfg.auto.top_k == [3, 5]


def test_unknown_strategy_lists_valid_ones(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_job(write(tmp_path, MINIMAL), ["sampling.strategy=magic"])
    assert "magic" in str(e.value) and "bm25" in str(e.value)


def test_unknown_format_rejected(tmp_path):
    bad = MINIMAL.replace("train: {format: stsb", "train: {format: xlsx")
    with pytest.raises(ConfigError) as e:
        load_job(write(tmp_path, bad))
    assert e.value.key.startswith("data.train.format")


def test_invalid_yaml_reports_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_job(write(tmp_path, "name: t\ndata: [unclosed\n"))
    assert "invalid YAML" in str(e.value) and "line" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_job(tmp_path / "nope.yaml")


def test_non_mapping_file(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        load_job(write(tmp_path, "- a\n- b\n"))


def test_overrides_parse_values_as_yaml():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=1.0e-5") == (["a"], 1e-5)
    assert parse_override("x.y=null") == (["x", "y"], None)
    assert parse_override("s={train: 10}") == (["s"], {"train": 10})
    with pytest.raises(ConfigError):
        parse_override("novalue")
    tree = apply_overrides({"a": {"b": 1}}, ["a.c=2", "d.e=x"])
    assert tree == {"a": {"b": 1, "c": 2}, "d": {"e": "x"}}


def test_override_applies(tmp_path):
    cfg = load_job(write(tmp_path, MINIMAL), ["sampling.top_k=7", "data.subsample={train: 10}", "bi_encoder.lr=1e-5"])
    assert cfg.sampling.top_k == 7 and cfg.data.subsample == {"train": 10}
    assert cfg.bi_encoder.lr == 1e-5  # YAML 1.1 reads "1e-5" as text; the typed config still gets a float


def test_env_expansion(tmp_path, monkeypatch):
    text = MINIMAL.replace("path: a.csv", 'path: "${MY_DATA:-/default}/a.csv"')
    assert load_job(write(tmp_path, text)).data.train.path == "/default/a.csv"
    monkeypatch.setenv("MY_DATA", "/elsewhere")
    assert load_job(write(tmp_path, text)).data.train.path == "/elsewhere/a.csv"
    with pytest.raises(ConfigError) as e:
        load_job(write(tmp_path, MINIMAL.replace("path: a.csv", 'path: "${SURELY_UNSET_VAR_X}/a"')))
    assert e.value.key == "data.train.path"


def test_dump_roundtrips(tmp_path):
    cfg = load_job(write(tmp_path, MINIMAL), ["sampling.top_k=5"])
    again = load_job(write(tmp_path, dump_job(cfg), "dumped.yaml"))
    assert again == cfg


def test_bad_label_range_rejected():
    import yaml

    tree = yaml.safe_load(MINIMAL)
    tree["data"]["train"]["label_range"] = [5, 0]
    with pytest.raises(ConfigError) as e:
        validate_tree(tree)
    assert e.value.key.startswith("data.train")


@pytest.mark.parametrize("search,message", [
    ({"seeds": 2, "keep": 3}, "keep: 3 is more than the 2 seeds"),
    ({"seeds": [1, 1, 2]}, "repeats a seed"),
    ({"seeds": []}, "at least one seed"),
    ({"prune_at": 0}, "prune_at"),
    ({"targets": ["student"]}, "targets"),
    ({"audit": True, "scheduler": "asha"}, "audit: needs scheduler: exact"),
])
def test_seed_search_settings_are_checked(search, message):
    src = {"format": "stsb", "path": "t.csv"}
    tree = {"name": "x", "data": {"train": src, "dev": src, "test": src}, "seed_search": search}
    with pytest.raises(ConfigError, match=message):
        validate_tree(tree)


def test_silver_first_is_refused_where_the_seed_search_picks_the_student():
    src = {"format": "stsb", "path": "t.csv"}
    tree = {"name": "x", "data": {"train": src, "dev": src, "test": src}, "bi_encoder": {"curriculum": "silver-first"}}
    validate_tree(tree)  # alone, or with the teacher's seed searched, it is a valid job
    validate_tree({**tree, "seed_search": {"enabled": True, "targets": ["cross_encoder"]}})
    with pytest.raises(ConfigError, match="silver-first trains the student twice"):
        validate_tree({**tree, "seed_search": {"enabled": True, "targets": ["bi_encoder"]}})
    with pytest.raises(ConfigError, match="curriculum"):
        validate_tree({**tree, "bi_encoder": {"curriculum": "gold-first"}})


@pytest.mark.parametrize("evaluation,target,message", [
    ({"pilot_folds": 1}, None, "evaluation.pilot_folds: 1 fold would hold out every gold pair"),
    ({"pilot_folds": -2}, None, "greater than or equal to 0"),
    ({"pilot_folds": 5, "pilot": True},
     {"pairs": {"format": "stsb", "path": "p.csv"}, "test": {"format": "stsb", "path": "q.csv"}},
     "a domain-adaptation job's pilots are scored on dev"),
    ({"pilot_folds": 5}, None, "evaluation.pilot_folds: 5 folds score the pilots of evaluation.pilot, which is off"),
])
def test_pilot_folds_are_checked(evaluation, target, message):
    src = {"format": "stsb", "path": "t.csv"}
    tree = {"name": "x", "data": {"train": src, "dev": src, "test": src}, "evaluation": evaluation}
    if target is not None:
        tree["target"] = target
    with pytest.raises(ConfigError, match=message):
        validate_tree(tree)
    validate_tree({**tree, "evaluation": {"pilot_folds": 5, "pilot": True}, "target": None})


@pytest.mark.parametrize("objective", ["cosent", "angle", "cosent-distill", "angle-distill"])
def test_ranking_objectives_are_for_regression(objective):
    src = {"format": "stsb", "path": "t.csv"}
    tree = {"name": "x", "data": {"train": src, "dev": src, "test": src}, "bi_encoder": {"objective": objective}}
    assert validate_tree(tree).bi_encoder.resolved_objective("regression") == objective
    with pytest.raises(ConfigError, match=f"bi_encoder.objective: {objective} ranks pairs by their similarity "
                                          "scores, and task is binary"):
        validate_tree({**tree, "task": "binary"})
    target = {"pairs": src, "test": src, "task": "binary"}  # a binary target's upper bound trains on its labels
    with pytest.raises(ConfigError, match="and target.task is binary"):
        validate_tree({**tree, "target": target})


def test_seed_list_counts_from_the_encoders_seed():
    from augsbert_ray.config import SeedSearchConfig

    assert SeedSearchConfig(seeds=3).seed_list(42) == [42, 43, 44]
    assert SeedSearchConfig(seeds=[7, 1]).seed_list(42) == [7, 1]


def test_the_config_names_exactly_the_samplers_there_are():
    from typing import get_args

    from augsbert_ray.candidates import SAMPLERS
    from augsbert_ray.config import Strategy

    assert set(get_args(Strategy)) == set(SAMPLERS)


def test_the_strategies_that_select_after_labelling_are_those_with_a_selector():
    from augsbert_ray.candidates import SELECTORS
    from augsbert_ray.config.sampling import SELECTED

    assert set(SELECTORS) == SELECTED


def test_a_section_given_twice_is_an_error_naming_both_lines(tmp_path):
    path = write(tmp_path, MINIMAL + "sampling:\n  top_k: 2\nseed: 1\nsampling:\n  top_k: 5\n")
    with pytest.raises(ConfigError) as e:
        load_job(path)
    assert e.value.key == "sampling" and "given twice in one mapping (lines 7 and 10)" in str(e.value)
    with pytest.raises(ConfigError, match=r"key 'data.train.path' given twice .*\(lines 4 and 4\)"):
        load_job(write(tmp_path, MINIMAL.replace("path: a.csv}", "path: a.csv, path: x.csv}")))
    # merge keys may be overridden, as YAML intends
    cfg = load_job(write(tmp_path, MINIMAL + "sampling: {<<: {top_k: 2, searchers: 2}, top_k: 4}\n"))
    assert (cfg.sampling.top_k, cfg.sampling.searchers) == (4, 2)


@pytest.mark.parametrize(("text", "key", "hint"), [
    ("bi_encoder: {epochz: 2}\n", "bi_encoder.epochz", "did you mean 'epochs'? (valid keys under bi_encoder: "
                                                       "batch_size, curriculum, epochs, gold_repeat, lr, "),
    ("samplng: {top_k: 2}\n", "samplng", "did you mean 'sampling'? (valid keys: auto, bi_encoder, cross_encoder, data,"),
    ("sampling: {faiss: {nlist: 3}}\n", "sampling.faiss.nlist", "did you mean 'ivf_nlist'?"),
    ("bi_encoder: {zzz: 2}\n", "bi_encoder.zzz", "unknown key (valid keys under bi_encoder: batch_size,"),
])
def test_an_unknown_key_gets_the_closest_valid_one_and_the_valid_keys(tmp_path, text, key, hint):
    with pytest.raises(ConfigError) as e:
        load_job(write(tmp_path, MINIMAL + text))
    assert e.value.key == key and hint in str(e.value)


def test_an_unknown_key_of_an_optional_section_gets_a_suggestion_too(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'data.dev.colums' unknown key; did you mean 'columns'\?"):
        load_job(write(tmp_path, MINIMAL), ["data.dev.colums={}"])


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "-x", ""])
def test_a_job_name_must_be_one_ordinary_folder_name(tmp_path, name):
    with pytest.raises(ConfigError) as e:
        load_job(write(tmp_path, MINIMAL), [f"name={name!r}"])
    assert e.value.key == "name" and "cannot name a job" in str(e.value) and "Value error" not in str(e.value)


def test_names_with_dots_inside_are_fine(tmp_path):
    assert load_job(write(tmp_path, MINIMAL), ["name=stsb.v2-1k_run"]).resolved_run_dir.name == "stsb.v2-1k_run"


def test_a_loaded_config_remembers_its_file_and_environment_variables(tmp_path, monkeypatch):
    monkeypatch.delenv("MY_DATA", raising=False)
    path = write(tmp_path, MINIMAL.replace("path: a.csv", 'path: "${MY_DATA:-/default}/a.csv"'))
    cfg = load_job(path)
    assert cfg.source == str(path)
    [ref] = cfg.env_references("data.train.path")
    assert (ref.name, ref.default, ref.value) == ("MY_DATA", "/default", None)
    assert cfg.env_references("data.test.path") == []


def test_run_dir_empty_is_refused_and_tilde_is_expanded(tmp_path, monkeypatch):
    path = write(tmp_path, MINIMAL)
    with pytest.raises(ConfigError) as info:
        load_job(path, ["run_dir="])
    assert info.value.key == "run_dir" and "is empty" in str(info.value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load_job(path, ["run_dir=~/runs/${name}"]).resolved_run_dir == tmp_path / "home" / "runs" / "t"


def test_a_name_too_long_for_a_directory_is_refused(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert load_job(path, ["name=" + "n" * 255]).name == "n" * 255
    with pytest.raises(ConfigError) as info:
        load_job(path, ["name=" + "n" * 256])
    assert info.value.key == "name" and "256 bytes is too long" in str(info.value)


def test_every_config_field_says_what_it_does():
    from pydantic import BaseModel

    from augsbert_ray.config import JobConfig
    from augsbert_ray.config.loading import _model_in

    missing, todo, seen = [], [("", JobConfig)], set()
    while todo:
        prefix, model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{prefix}{name}")
            if (sub := _model_in(field.annotation)) is not None and issubclass(sub, BaseModel):
                todo.append((f"{prefix}{name}.", sub))
    assert missing == []
