"""The optional modules a job's or ``augsbert bench``'s settings need, checked before Ray starts.

The package's extras install them (``pyproject.toml``): ``cpu`` / ``gpu`` (faiss, for
semantic search), ``hub`` (``datasets``, for hub datasets) and ``bench`` (the peers
``augsbert bench`` measures against). A module that is missing stops the command in one line
naming the setting that needs it and the extra to install, instead of failing in the stage
that imports it, possibly after an hour of training. ``augsbert label`` needs none of them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass

from augsbert_ray.errors import ConfigError

# what installs the modules of each use
FAISS = 'pip install "augsbert-ray[cpu]" (or "augsbert-ray[gpu]" on a GPU host)'
HUB = 'pip install "augsbert-ray[hub]"'
BENCH = 'pip install "augsbert-ray[bench]"'

# The sampling strategies that search embeddings with faiss (candidates.EMBEDS; a test keeps
# them equal without this module importing the samplers).
FAISS_STRATEGIES = frozenset({"ss", "bm25+ss"})

# augsbert bench's parts -> (module, what the part does with it): the modules beyond the core
# that the part or its peer imports.
BENCH_PART_MODULES = {
    "semantic": (("faiss", "searches the engine's Faiss indexes"),),
    "bm25": (("bm25s", "measures its peer, bm25s"),),
    # the peer's SentenceTransformer.fit runs sentence-transformers' trainer (its "train" extra)
    "training": (("datasets", "measures its peer, SentenceTransformer.fit, which needs datasets"),
                 ("accelerate", "measures its peer, SentenceTransformer.fit, which needs accelerate")),
}


@dataclass(frozen=True)
class Need:
    """A module that a setting needs.

    Attributes:
        module: the import name.
        key: the setting (a job's dotted key, or a command-line option).
        why: what the setting does with it, for the message (``bm25+ss searches embeddings``).
        install: the command that installs it (the extra).
    """

    module: str
    key: str
    why: str
    install: str


def installed(module: str) -> bool:
    """Whether ``module`` can be found for import (without importing it: some are slow to import)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def job_needs(cfg) -> list[Need]:
    """The optional modules a job's settings need (``config.JobConfig``)."""
    needs = []
    # In-domain jobs and target corpora sample with the strategy; target pairs are taken as they are.
    if cfg.target is None or cfg.target.corpus is not None:
        if cfg.sampling.strategy in FAISS_STRATEGIES:
            needs.append(Need("faiss", "sampling.strategy", f"{cfg.sampling.strategy} searches embeddings with faiss",
                              FAISS))
    if cfg.auto.enabled:
        tried = [s for s in cfg.auto.strategies if s in FAISS_STRATEGIES]
        if tried:
            needs.append(Need("faiss", "auto.strategies", f"the autopilot tries {', '.join(tried)}, which search "
                                                          "embeddings with faiss", FAISS))
    sources = [(f"data.{s}", getattr(cfg.data, s)) for s in ("train", "dev", "test")]
    if cfg.target is not None:
        sources += [(f"target.{s}", getattr(cfg.target, s)) for s in ("pairs", "test", "dev")]
    for key, source in sources:
        if source is not None and source.format == "hf":
            needs.append(Need("datasets", f"{key}.format", f"format hf reads the hub dataset {source.path} with "
                                                           "the datasets package", HUB))
    return needs


def bench_needs(parts: Iterable[str]) -> list[Need]:
    """The optional modules ``augsbert bench``'s ``parts`` need."""
    return [Need(module, "--parts", f"the {part} part {why} (leave it out of --parts, or install it)",
                 FAISS if module == "faiss" else BENCH)
            for part in parts for module, why in BENCH_PART_MODULES.get(part, ())]


def require(needs: Iterable[Need], source: str | None) -> None:
    """Raises on the first need whose module is not installed.

    Args:
        needs: from ``job_needs`` or ``bench_needs``.
        source: the job file, named by the error; None: the need's key is an option (``--parts``)
            and is named alone.

    Raises:
        ConfigError: naming the setting, the missing module and the extra that installs it.
    """
    for need in needs:
        if not installed(need.module):
            reason = f"{need.why}, and {need.module} is not installed: {need.install}"
            raise ConfigError(source, need.key, reason) if source else ConfigError(need.key, None, reason)
