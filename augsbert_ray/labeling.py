"""Step 2.2: the cross-encoder labels candidate pairs ("silver" labels).

``score_pairs`` is the pure core (model in, scores out). ``PairScorer`` is the Ray Data
callable that loads the model once per actor, and ``label_candidates`` runs an actor pool
over the candidate table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from augsbert_ray import schema


def score_pairs(model, tokenizer, s1: list[str], s2: list[str], *, micro_batch_size: int = 64,
                max_length: int = 128, device: str = "cpu") -> np.ndarray:
    """Scores sentence pairs with a one-logit cross-encoder: sigmoid(logit) in [0, 1].

    Pairs are tokenised once, sorted by token length and run in micro-batches of similar
    length, so little compute is spent on padding; scores come back in input order.

    Args:
        model: a ``transformers`` sequence-classification model with one output, in eval mode.
        tokenizer: its tokenizer.
        s1, s2: the pairs' first and second sentences.
        micro_batch_size: pairs per forward pass.
        max_length: token limit of a pair (longer pairs are truncated).
        device: where ``model`` lives.

    Returns:
        float32 array of shape (len(s1),).
    """
    import torch

    n = len(s1)
    out = np.empty(n, dtype=np.float32)
    if n == 0:
        return out
    enc = tokenizer(list(s1), list(s2), truncation=True, max_length=max_length)
    lengths = np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int64, count=n)
    order = np.argsort(-lengths, kind="stable")
    keys = list(enc.keys())
    with torch.inference_mode():
        for start in range(0, n, micro_batch_size):
            idx = order[start : start + micro_batch_size]
            batch = tokenizer.pad({k: [enc[k][i] for i in idx] for k in keys}, return_tensors="pt").to(device)
            logits = model(**batch).logits.float().reshape(-1)
            out[idx] = torch.sigmoid(logits).cpu().numpy()
    return out


class PairScorer:
    """Ray Data callable: loads the cross-encoder once, adds a ``label`` column to each batch."""

    def __init__(self, model_dir: str, micro_batch_size: int, max_length: int, threads: int, use_gpu: bool):
        import torch

        from augsbert_ray.models import load_cross_encoder

        torch.set_num_threads(max(1, threads))
        self.device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        self.model, self.tokenizer = load_cross_encoder(model_dir, device=self.device)
        self.model.eval()
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length

    def __call__(self, batch: pa.Table) -> pa.Table:
        scores = score_pairs(
            self.model,
            self.tokenizer,
            batch.column(schema.SENTENCE1).to_pylist(),
            batch.column(schema.SENTENCE2).to_pylist(),
            micro_batch_size=self.micro_batch_size,
            max_length=self.max_length,
            device=self.device,
        )
        return batch.append_column(schema.LABEL, pa.array(scores, pa.float32()))


def label_candidates(candidates: pa.Table, model_dir: str, cfg, max_length: int, cpus_per_actor: float) -> pa.Table:
    """Labels candidates with an actor pool of cross-encoders.

    Args:
        candidates: ``schema.CANDIDATE_SCHEMA`` rows.
        model_dir: the trained cross-encoder.
        cfg: ``config.LabelingConfig`` (actors, GPUs, batch sizes).
        max_length: token limit of a pair.
        cpus_per_actor: CPUs reserved per actor (and torch threads it uses).

    Returns:
        ``schema.SILVER_SCHEMA`` rows sorted by (id1, id2): one per candidate.
    """
    import ray
    from ray.data import ActorPoolStrategy

    from augsbert_ray.runtime import dataset_of_blocks

    if candidates.num_rows == 0:
        return schema.empty_table(schema.SILVER_SCHEMA)
    labelled = dataset_of_blocks(candidates, cfg.block_size).map_batches(
        PairScorer,
        fn_constructor_kwargs={
            "model_dir": model_dir,
            "micro_batch_size": cfg.micro_batch_size,
            "max_length": max_length,
            "threads": int(cpus_per_actor),
            "use_gpu": cfg.num_gpus > 0,
        },
        compute=ActorPoolStrategy(size=cfg.actors),
        batch_size=cfg.block_size,
        batch_format="pyarrow",
        num_cpus=cpus_per_actor,
        num_gpus=cfg.num_gpus,
    )
    silver = pa.concat_tables(ray.get(labelled.to_arrow_refs())).cast(schema.SILVER_SCHEMA)
    silver = silver.take(pc.sort_indices(silver, [(schema.ID1, "ascending"), (schema.ID2, "ascending")]))
    if silver.num_rows != candidates.num_rows:  # every candidate gets exactly one label
        raise RuntimeError(f"labelling returned {silver.num_rows} rows for {candidates.num_rows} candidates")
    return silver
