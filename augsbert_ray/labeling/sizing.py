"""How big the labelling pool is and what each of its actors reserves (pure: config in,
numbers out)."""

from __future__ import annotations

# CPUs a tokenising task holds (Ray Data runs as many as there are CPUs left for them).
TOKENIZE_CPUS = 1


def pool_size(cfg, cluster_gpus: float, cluster_cpus: float | None = None) -> int:
    """Labelling actors: ``cfg.actors`` if set; by default, when actors have GPUs, as many as the
    cluster's GPUs hold (``cluster_gpus // cfg.num_gpus``, at least one, so a cluster that is
    still adding GPU nodes starts with one) and its CPUs hold beside the tokenising task
    (``cluster_cpus``, when given: a node with as many GPUs as CPUs could not run one actor per
    GPU and the task that feeds them); one on CPU, which gets all its cores."""
    if cfg.actors:
        return cfg.actors
    if cfg.num_gpus > 0:
        actors = int(cluster_gpus // cfg.num_gpus)
        if cluster_cpus is not None:
            spare = TOKENIZE_CPUS if separate_tokenizer(cfg) else 0
            actors = min(actors, int((cluster_cpus - spare) // (cfg.num_cpus or 1.0)))
        return max(1, actors)
    return 1


def separate_tokenizer(cfg) -> bool:
    """Whether pairs are tokenised in CPU tasks ahead of the actors (by default when they have GPUs)."""
    return cfg.tokenize_stage == "separate" or (cfg.tokenize_stage == "auto" and cfg.num_gpus > 0)


def actor_cpus(cfg, cluster_cpus: float, actors: int) -> float:
    """CPUs each labelling actor reserves.

    ``cfg.num_cpus`` if set. By default an actor with a GPU reserves one CPU (it pads batches
    and drives the GPU; tokenising is done ahead of it), leaving the node's other CPUs to the
    tokenising tasks and Ray Data. On CPU, the actors share the cores, less one that the
    tokenising tasks need when they run ahead of the actors: an actor holding every CPU
    would leave them none, and the pipeline would wait for ever.
    """
    if cfg.num_cpus is not None:
        return cfg.num_cpus
    if cfg.num_gpus > 0:
        return 1.0
    spare = TOKENIZE_CPUS if separate_tokenizer(cfg) else 0
    return max(1.0, float(int((cluster_cpus - spare) // max(1, actors))))


def labelling_requests(cfg, actors: int, cpus_per_actor: float) -> list[dict]:
    """The resources the labelling pipeline needs at once: every actor, and (with a separate
    tokenising stage) one tokenising task, without which it cannot make progress."""
    requests = [{"CPU": cpus_per_actor, "GPU": cfg.num_gpus}] * actors
    if separate_tokenizer(cfg):
        requests = requests + [{"CPU": TOKENIZE_CPUS}]
    return requests
