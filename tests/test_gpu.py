"""On a CUDA GPU: labelling, the labelling pipeline, training and Faiss give what the CPU
gives. Skipped where there is no GPU (``-m gpu`` selects them; benchmarks/gpu_check.py runs
them on a GPU host)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import make_sentence

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def _pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    return [make_sentence(rng) for _ in range(n)], [make_sentence(rng) for _ in range(n)]


@pytest.fixture
def teacher(tiny_cross_encoder) -> str:
    return tiny_cross_encoder


def test_bf16_scores_on_the_gpu_agree_with_fp32_on_the_cpu(teacher):
    from augsbert_ray.models import load_cross_encoder
    from augsbert_ray.scoring import prepare_model, resolve_precision, score_pairs, score_tokenized, tokenize_pairs

    s1, s2 = _pairs(300, 1)
    cpu_model, tok = load_cross_encoder(teacher, device="cpu")
    ref = score_pairs(prepare_model(cpu_model, "fp32", "cpu"), tok, s1, s2, device="cpu")
    assert resolve_precision("auto", "cuda") in ("bf16", "fp16")
    gpu_model, _ = load_cross_encoder(teacher, device="cuda")
    fp32 = score_pairs(prepare_model(gpu_model, "fp32", "cuda"), tok, s1, s2, device="cuda")
    assert np.abs(fp32 - ref).max() < 1e-4  # the same model, the same scores
    gpu_model, _ = load_cross_encoder(teacher, device="cuda")
    auto = prepare_model(gpu_model, resolve_precision("auto", "cuda"), "cuda")
    half = score_pairs(auto, tok, s1, s2, device="cuda")
    # Within bf16's rounding of fp32. No ranking check: a random tiny model's scores differ
    # between pairs by about 1e-5, below bf16's resolution (on an H200 the Spearman of bf16
    # against fp32 was 0.51 for that reason alone).
    assert np.abs(half - ref).max() < 0.02
    # from tokens, as a GPU actor gets them from the tokenising stage
    tokens = tokenize_pairs(tok, s1, s2, 128)
    assert np.abs(score_tokenized(auto, tokens, pad_id=tok.pad_token_id, device="cuda") - half).max() < 1e-3


def test_the_pipeline_labels_every_pair_on_a_gpu_actor(ray_local, teacher):
    import pyarrow as pa

    from augsbert_ray import schema
    from augsbert_ray.config import LabelingConfig
    from augsbert_ray.labeling import actor_cpus, label_candidates, pool_size

    if ray_local.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("the session's Ray sees no GPU")
    s1, s2 = _pairs(500, 2)
    n = len(s1)
    cands = pa.table({schema.ID1: pa.array(np.arange(n) * 2), schema.ID2: pa.array(np.arange(n) * 2 + 1),
                      schema.SENTENCE1: s1, schema.SENTENCE2: s2, schema.ORIGIN: ["bm25"] * n,
                      schema.RETRIEVAL_SCORE: pa.array(np.ones(n), pa.float32())}, schema=schema.CANDIDATE_SCHEMA)
    cfg = LabelingConfig(num_gpus=1, block_size=128)
    actors = pool_size(cfg, ray_local.cluster_resources()["GPU"])
    silver = label_candidates(cands, teacher, cfg, 128, actor_cpus(cfg, 2, actors), actors=actors)
    assert silver.num_rows == n and np.isfinite(silver.column(schema.LABEL).to_numpy()).all()


def test_training_on_the_gpu_in_bf16_learns_and_keeps_fp32_weights(tiny_model):
    import torch

    from augsbert_ray.training.loop import HParams, PairTrainer
    from augsbert_ray.training.recipes import BiEncoderRecipe

    s1, s2 = _pairs(64, 3)
    labels = np.array([1.0 if a.split()[1] == b.split()[1] else 0.0 for a, b in zip(s1, s2)], np.float32)
    trainer = PairTrainer(BiEncoderRecipe(model=tiny_model, max_length=32), s1, s2, labels,
                          HParams(epochs=4, lr=1e-3, batch_size=16, warmup_ratio=0.0, seed=0, precision="auto"),
                          device="cuda")
    assert trainer.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    trainer.run(until=1)
    first = trainer.losses[-1]
    trainer.run()
    assert np.mean(trainer.losses[-4:]) < first
    assert all(p.dtype == torch.float32 for p in trainer.module.parameters())


def test_faiss_on_the_gpu_finds_what_it_finds_on_the_cpu():
    faiss = pytest.importorskip("faiss")
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        pytest.skip("faiss has no GPU support here (install faiss-gpu)")
    from augsbert_ray.candidates.semantic import build_faiss_index, search_top_k
    from augsbert_ray.config import FaissConfig

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(2000, 32)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    on_gpu = search_top_k(build_faiss_index(emb, FaissConfig(use_gpu=True), 0), emb, 3)
    on_cpu = search_top_k(build_faiss_index(emb, FaissConfig(use_gpu=False), 0), emb, 3)
    assert (on_gpu[1] == on_cpu[1]).mean() > 0.99
