"""Shared fixtures: a tiny random BERT on the shipped tokenizer, a local Ray, small data.

The tiny model (2 layers, hidden size 32) is built once per test session and copied per
test, so tests never need a hub and run in seconds on a CPU.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    return Path(os.environ.get("AUGSBERT_DATA_DIR", REPO.parent / "shared" / "data"))


# Test files that run whole jobs or long Ray runs, roughly longest first (from CI's
# --durations, both tiers). They are collected first so that test workers (pytest-xdist, a file per worker)
# start them early instead of leaving one worker running a long file alone at the end; the
# order of tests within a file is kept.
LONGEST_FIRST = ("test_driver_killed.py", "test_gpu_placement.py", "test_pipeline.py", "test_gpu_check.py",
                 "test_smoke_job.py", "test_gpu_placement_dp.py", "test_job_submission.py",
                 "test_domain_adaptation.py", "test_labeling_failure.py", "test_labeling.py", "test_autopilot.py",
                 "test_node_loss.py", "test_seed_search.py", "test_training_failure.py",
                 "test_pipeline_binary.py", "test_permanent_errors.py", "test_corpus.py", "test_semantic.py",
                 "test_scoring.py")


def pytest_terminal_summary(terminalreporter):
    """Each tier's share of the run: its tests' summed times (setup, call and teardown), so
    that one run of both tiers (.ci/run) still says what each costs."""
    totals: dict[str, list[float]] = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) in ("setup", "call", "teardown") and hasattr(r, "duration"):
                tier = "slow" if "slow" in r.keywords else "default"
                t = totals.setdefault(tier, [0.0, 0])
                t[0] += r.duration
                t[1] += r.when == "call"
    for tier, (seconds, n) in sorted(totals.items()):
        terminalreporter.write_line(f"{tier} tier: {n} tests, {seconds:.0f} s of test time summed over workers")


def pytest_collection_modifyitems(config, items):
    """Long test files first (see LONGEST_FIRST); tests marked ``gpu`` need a CUDA GPU:
    skipped, with the reason, where there is none."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's order is kept
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
        for item in gpu_tests:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared STSb / MRPC files; tests that need them skip with a reason when absent."""
    d = shared_data_dir()
    if not (d / "stsb" / "sts-train.csv").exists():
        pytest.skip(f"STS benchmark not found under {d} (set AUGSBERT_DATA_DIR)")
    return d


@pytest.fixture(scope="session")
def _tiny_model_master(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from augsbert_ray.models import embedded_model_dir

    out = tmp_path_factory.mktemp("tiny-bert")
    # AUGSBERT_TEST_TOKENIZER: a folder with MiniLM's tokenizer files, for a host without the
    # embedded model's package (benchmarks/gpu_check.py sets it).
    tokenizer = AutoTokenizer.from_pretrained(os.environ.get("AUGSBERT_TEST_TOKENIZER")
                                              or str(embedded_model_dir(verify=False)))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def tiny_model(_tiny_model_master, tmp_path) -> str:
    """Path of a private copy of a 2-layer random BERT (usable as bi- or cross-encoder)."""
    dst = tmp_path / "tiny-bert"
    shutil.copytree(_tiny_model_master, dst)
    return str(dst)


def _start_local_ray():
    import ray

    from augsbert_ray.runtime import LOCAL_TRAIN_ENV_DEFAULTS, TRAIN_ENV_DEFAULTS, local_ray_options

    for key, value in {**TRAIN_ENV_DEFAULTS, **LOCAL_TRAIN_ENV_DEFAULTS}.items():
        os.environ.setdefault(key, value)
    # address="local": a Ray of its own, never one that RAY_ADDRESS or another process names
    ray.init(address="local", **local_ray_options(2), include_dashboard=False, log_to_driver=False)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session (starting one costs seconds)."""
    import ray

    if not ray.is_initialized():
        _start_local_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _ray_left_as_found(request):
    """After each test file, the session's Ray must have all its CPUs free again: an actor that
    a test file left alive (a failed pool's actor, say) would make a later file's training
    wait for it until that file's time limit. Such a Ray is restarted for the files after it,
    and the file that leaked fails, naming what was left alive."""
    import sys

    yield
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        if time.monotonic() > deadline:
            from ray._private import state  # the actors' table from the GCS (no dashboard here)

            alive = sorted(a["ActorClassName"] for a in state.actors().values() if a["State"] != "DEAD")
            held = ray.available_resources()
            ray.shutdown()
            _start_local_ray()
            pytest.fail(f"{request.node.nodeid} left the session's Ray with CPUs held ({held}; actors alive: "
                        f"{alive}): an actor or task it started outlived it", pytrace=False)
        time.sleep(0.5)


SUBJECTS = ["A man", "A woman", "The dog", "A child", "The chef", "A cat", "Two boys", "The pilot"]
VERBS = ["is playing", "is cutting", "is eating", "is riding", "is watching", "is cleaning"]
OBJECTS = ["a guitar", "an onion", "the bread", "a horse", "the television", "a flute", "the kitchen"]


def load_benchmark(name: str):
    """A script of ``benchmarks/`` as a module (they run as scripts, not as a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."


def write_stsb(path: Path, n: int, seed: int) -> Path:
    """Writes an STSb-format TSV of ``n`` synthetic pairs with scores in [0, 5]."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        a = make_sentence(rng)
        b = a if rng.random() < 0.3 else make_sentence(rng)
        score = 5.0 if a == b else round(rng.uniform(0, 4), 2)
        lines.append(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{score}\t{a}\t{b}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tiny_cross_encoder(tiny_model, tmp_path) -> str:
    """A saved cross-encoder checkpoint: its one-logit head is fixed, not drawn at load."""
    from augsbert_ray.models import load_cross_encoder

    model, tok = load_cross_encoder(tiny_model)
    out = tmp_path / "tiny-ce"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on loopback now."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture
def tiny_stsb(tmp_path) -> dict[str, Path]:
    """Small synthetic STSb-format train/dev/test files."""
    return {
        split: write_stsb(tmp_path / f"sts-{split}.csv", n, seed)
        for split, n, seed in [("train", 48, 1), ("dev", 24, 2), ("test", 24, 3)]
    }


def write_mrpc(path: Path, n: int, seed: int) -> Path:
    """Writes an MRPC-format file (BOM, CRLF, header) of ``n`` synthetic 0/1 pairs."""
    rng = random.Random(seed)
    lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i in range(n):
        a = make_sentence(rng)
        paraphrase = rng.random() < 0.5
        b = a.replace(".", " today.") if paraphrase else make_sentence(rng)
        lines.append(f"{int(paraphrase)}\t{1000 + i}\t{5000 + i}\t{a}\t{b}")
    path.write_bytes("\r\n".join(lines).encode("utf-8") + b"\r\n")
    return path


def fake_model(path, weights=("model.safetensors",), tokenizer=True):
    """A model folder as the pre-flight checks see it: the files' names, no real weights
    (nothing loads them before Ray starts)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    for name in weights:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(TINY_SAFETENSORS if name.endswith(".safetensors") else b"\0")
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


def safetensors_bytes(tensors: dict[str, list[int]]) -> bytes:
    """A well-formed safetensors file of zero-filled F32 tensors (name -> shape), built by hand."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(offset)


TINY_SAFETENSORS = safetensors_bytes({"w": [2, 2]})


@pytest.fixture
def one_torch_thread():
    """torch's intra-op threads at one for the test (put back after): faster on a small shared
    CPU, and the same reductions every run."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
