"""The labelling actor: a Ray Data callable that holds one cross-encoder and scores batches."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa

from augsbert_ray import schema
from augsbert_ray.labeling.codec import IDS, TYPES, tokens_from_arrow
from augsbert_ray.labeling.shards import SHARD
from augsbert_ray.scoring import (CPU_TOKEN_BUDGET, GPU_TOKEN_BUDGET, prepare_model, resolve_precision, score_pairs,
                                  score_tokenized)

# {"path": file, "delay_s": s}: each actor logs its node and each batch's start and end there,
# and holds every batch delay_s seconds (JSON; unset in normal runs). The chaos tests read it
# to see which shards were in flight when a node or the driver was killed.
TRACE_ENV = "AUGSBERT_LABEL_TRACE"


def trace_hook() -> dict | None:
    """The ``TRACE_ENV`` settings of this process, or None."""
    text = os.environ.get(TRACE_ENV)
    return json.loads(text) if text else None


@dataclass(frozen=True)
class ScorerSpec:
    """What the labelling actors are: a Ray Data callable class and its constructor's keyword
    arguments (Ray Data builds one instance per actor). By default the pool builds
    ``PairScorer`` with ``pair_scorer_kwargs``; a benchmark may pass another class that takes a
    batch and returns it with a label column."""

    cls: type
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    # Calls an actor runs at once (threads): above 1 the class keeps its model to one call at a
    # time itself, so that what it does beside the model overlaps the next call's labelling.
    concurrent_calls: int = 1


def pair_scorer_kwargs(model_dir: str, cfg, max_length: int, threads: float) -> dict:
    """``PairScorer``'s constructor arguments in a labelling run: ``model_dir``'s cross-encoder
    under ``cfg`` (``config.LabelingConfig``), with ``threads`` torch threads (the CPUs an actor
    reserves)."""
    return {
        "model_dir": model_dir,
        "micro_batch_size": cfg.micro_batch_size,
        "max_length": max_length,
        "threads": int(threads),
        "use_gpu": cfg.num_gpus > 0,
        "precision": cfg.precision,
        "token_budget": cfg.token_budget,
        "compile": cfg.compile,
        "trace": trace_hook(),
    }


class PairScorer:
    """Ray Data callable: loads the cross-encoder once, adds a ``label`` column to each batch.

    A batch that arrives tokenised (by ``codec.tokenize_batch``) is scored from its token
    columns, which are dropped from the output; otherwise the actor tokenises it itself.
    """

    def __init__(self, model_dir: str, micro_batch_size: int, max_length: int, threads: int, use_gpu: bool,
                 precision: str = "fp32", token_budget: int = 0, compile: bool = False, trace: dict | None = None):
        import torch

        from augsbert_ray.models import load_cross_encoder

        torch.set_num_threads(max(1, threads))
        torch.manual_seed(0)  # a model without a trained head gets the same new one in every actor and run
        self.device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        model, self.tokenizer = load_cross_encoder(model_dir, device=self.device)
        self.precision = resolve_precision(precision, self.device)
        self.model = prepare_model(model, self.precision, self.device, compile=compile)
        print(f"[silver] labelling actor on {self.device}: {self.precision}"
              f"{' (precision: auto)' if precision == 'auto' else ''}, {max(1, threads)} threads", flush=True)
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length
        self.token_budget = token_budget or (GPU_TOKEN_BUDGET if self.device == "cuda" else CPU_TOKEN_BUDGET)
        self.trace = trace
        if self.trace:
            import ray

            with open(self.trace["path"], "a", encoding="utf-8") as f:
                f.write(f"actor {ray.get_runtime_context().get_node_id()}\n")

    def _trace(self, event: str, batch: pa.Table) -> None:
        shards = sorted(set(batch.column(SHARD).to_pylist())) if SHARD in batch.column_names else []
        with open(self.trace["path"], "a", encoding="utf-8") as f:
            f.write(f"{event} {' '.join(map(str, shards))}\n")

    def score(self, batch: pa.Table) -> tuple[pa.Table, object]:
        """The batch without its token columns, and its pairs' scores."""
        if IDS in batch.column_names:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            scores = score_tokenized(self.model, tokens_from_arrow(batch), pad_id=pad, token_budget=self.token_budget,
                                     max_pairs=self.micro_batch_size, device=self.device)
            return batch.drop_columns([c for c in (IDS, TYPES) if c in batch.column_names]), scores
        return batch, score_pairs(self.model, self.tokenizer, batch.column(schema.SENTENCE1).to_pylist(),
                                  batch.column(schema.SENTENCE2).to_pylist(), micro_batch_size=self.micro_batch_size,
                                  max_length=self.max_length, device=self.device, token_budget=self.token_budget)

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.trace:
            self._trace("start", batch)
            time.sleep(float(self.trace.get("delay_s", 0)))
        batch, scores = self.score(batch)
        if self.trace:
            self._trace("end", batch)
        return batch.append_column(schema.LABEL, pa.array(scores, pa.float32()))
