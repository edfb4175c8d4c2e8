"""Model cards: rendered from hand-made card data (no Ray), and the saved models load with
sentence-transformers as the job's own code reads them."""

import os

import numpy as np
import yaml

from augsbert_ray.model_card import EMBEDDED_HUB_ID, CardData, SilverFacts, TrainingFacts, render_card
from augsbert_ray.run_cards import write_card

SCORES = {"zero_shot": {"dev": {"spearman": 71.234, "pairs": 10}, "test": {"spearman": 70.5, "pairs": 10}},
          "gold_only": {"dev": {"spearman": 80.111, "pairs": 10}, "test": {"spearman": 78.25, "pairs": 10}},
          "cross_encoder": {"dev": {"spearman": 85.678, "pairs": 10}, "test": {"spearman": 84.0, "pairs": 10}},
          "augsbert": {"dev": {"spearman": 81.333, "pairs": 10}, "test": {"spearman": 79.987, "pairs": 10}}}
TRAINING = TrainingFacts(objective="cosine", epochs=3, batch_size=16, lr=2e-5, warmup_ratio=0.1, max_length=96,
                         seed=7, num_layers=2, base_layers=6, pairs=1234, steps=78, final_loss=0.0412)


def card(model="augsbert", **kw) -> CardData:
    base = dict(model=model, base_model="embedded", base_model_hub=EMBEDDED_HUB_ID, path="/runs/x/models/m",
                training=TRAINING, job="stsb-x", task="regression", metric="spearman", dataset="stsb file sts-train.csv",
                gold={"train": 500, "dev": 100, "test": 100},
                silver=SilverFacts(pairs=734, gold_repeat=2, strategy="bm25", top_k=3, candidates=900, labelled=900,
                                   teacher="the job's cross-encoder", calibration="isotonic"),
                scores=SCORES, hidden_size=384, layers=2, versions={"sentence_transformers": "6.2.0"}, final=True,
                teacher_check={"metric": "spearman", "cross_encoder_dev": 85.678, "gold_only_dev": 80.111,
                               "gap": 5.567},
                shipped={"shipped": "augsbert", "why": "AugSBERT leads gold only on dev (81.33 vs 80.11)",
                         "policy": "better"})
    return CardData(**{**base, **kw})


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_a_bi_encoder_card_says_what_was_trained_on_what_and_how_it_scored():
    text = render_card(card())
    meta = front_matter(text)
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
    assert meta["base_model"] == EMBEDDED_HUB_ID and "sentence-transformers" in meta["tags"]
    results = meta["model-index"][0]["results"]
    assert [r["dataset"]["name"] for r in results] == ["stsb-x dev", "stsb-x test"]
    assert results[1]["metrics"] == [{"type": "spearman", "value": 0.7999, "name": "Spearman"}]  # its own, not another's
    assert meta["metrics"] == ["spearman"]
    assert "| **AugSBERT bi-encoder** | **81.33** | **79.99** |" in text
    assert "| Cross-encoder (teacher) | 85.68 | 84.00 |" in text and "| Zero-shot bi-encoder | 71.23 | 70.50 |" in text
    assert "gap +5.57): the teacher leads" in text and "AugSBERT leads gold only on dev (81.33 vs 80.11). This is that model." in text
    for fact in ("`num_train_epochs`: 3", "`learning_rate`: 2e-05", "`warmup_ratio`: 0.1", "`max_seq_length`: 96",
                 "first 2 of the base model's 6 transformer layers", "734 (bm25 sampling, top_k 3; 900 candidates",
                 "calibrated to the gold scale (isotonic)", "repeated 2x", "Gold pairs (stsb file sts-train.csv): "
                 "train 500, dev 100, test 100", "CosineSimilarityLoss", "SentenceTransformer('/runs/x/models/m')",
                 "# (3, 384)", "Output Dimensionality:** 384", "thakur-2020-AugSBERT", "Sentence Transformers: 6.2.0"):
        assert fact in text, fact
    assert "1B sentence pairs" not in text and "TPU" not in text


def test_the_cross_encoder_card_and_an_early_card():
    ce = render_card(card("cross_encoder", silver=None, training=TrainingFacts(
        objective="bce", epochs=4, batch_size=16, lr=2e-5, warmup_ratio=0.1, max_length=128, pairs=500)))
    meta = front_matter(ce)
    assert meta["pipeline_tag"] == "text-ranking" and "cross-encoder" in meta["tags"]
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 0.8568
    assert "CrossEncoder('/runs/x/models/m')" in ce and "BinaryCrossEntropyLoss" in ce
    assert "| **Cross-encoder (teacher)** | **85.68** | **84.00** |" in ce and "Silver pairs" not in ce
    # Written when trained: no scores, no job yet; a local base model is no hub id.
    early = render_card(CardData(model="gold_only", base_model="/models/tiny", path="/m", training=TRAINING,
                                 gold={"train": 48}))
    meta = front_matter(early)
    assert "base_model" not in meta and "model-index" not in meta
    assert "No scores yet" in early and "`/models/tiny`" in early and "Gold pairs: train 48" in early
    silver = render_card(CardData(model="augsbert", base_model="org/model", base_model_hub="org/model", path="/m",
                                  training=TRAINING, gold={"train": 48}, silver=SilverFacts(pairs=5, gold_repeat=3)))
    assert "Silver pairs: 5 (sampled pairs), labelled by the job's cross-encoder." in silver and "repeated 3x" in silver
    assert front_matter(silver)["base_model"] == "org/model"


def test_the_shipped_copy_names_its_decision():
    gold = {"shipped": "gold_only", "why": "gold only leads AugSBERT on dev (80.11 vs 79.00)", "policy": "better"}
    text = render_card(card("gold_only", silver=None, shipped=gold, published_as="models/bi-encoder"))
    assert front_matter(text)["pipeline_tag"] == "sentence-similarity"
    assert "# Shipped bi-encoder of the AugSBERT job `stsb-x`: the Bi-encoder, gold only" in text
    assert "shipped it as `models/bi-encoder`: gold only leads AugSBERT" in text
    assert "| **Bi-encoder, gold only** | **80.11** | **78.25** |" in text


def test_a_card_replaces_a_hard_linked_one_without_touching_its_twin(tmp_path):
    stage, published = tmp_path / "stage", tmp_path / "published"
    stage.mkdir(), published.mkdir()
    (stage / "README.md").write_text("the stage's card")
    os.link(stage / "README.md", published / "README.md")
    write_card(published, "the run's card")
    assert (stage / "README.md").read_text() == "the stage's card"
    assert (published / "README.md").read_text() == "the run's card"


def test_a_card_is_not_part_of_a_models_content_id(tiny_model):
    from pathlib import Path

    from augsbert_ray.models import model_content_id

    before = model_content_id(tiny_model)
    (Path(tiny_model) / "README.md").write_text("a card")
    assert model_content_id(tiny_model) == before
    (Path(tiny_model) / "vocab_extra.txt").write_text("a file the model reads")
    assert model_content_id(tiny_model) != before


def test_saved_models_load_with_sentence_transformers_as_the_job_reads_them(tiny_model, tmp_path):
    from pathlib import Path

    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer

    from augsbert_ray.models import check_local_weights, load_cross_encoder
    from augsbert_ray.scoring import score_pairs
    from augsbert_ray.training.recipes import BiEncoderRecipe, CrossEncoderRecipe

    (Path(tiny_model) / "README.md").write_text("trained on a 1B sentence pairs dataset")  # a base model's card
    ce_dir, bi_dir = tmp_path / "ce", tmp_path / "bi"
    recipe = CrossEncoderRecipe(model=tiny_model, max_length=12)
    recipe.save(recipe.build("cpu"), str(ce_dir))
    ce = CrossEncoder(str(ce_dir), device="cpu")
    assert isinstance(ce.activation_fn, torch.nn.Sigmoid) and ce.max_seq_length == 12
    s1 = ["A man is playing a guitar on the stage tonight with his old friends from school.", "A cat."]
    s2 = ["Someone plays music to a large crowd that came from every part of the country.", "A dog runs."]
    model, tokenizer = load_cross_encoder(str(ce_dir))  # the job's own loader and scorer
    ours = score_pairs(model.eval(), tokenizer, s1, s2, max_length=12)
    np.testing.assert_allclose(ce.predict(list(zip(s1, s2))), ours, atol=1e-5)
    check_local_weights(ce_dir)  # still ships to workers

    bi = BiEncoderRecipe(model=tiny_model, max_length=16, num_layers=1)
    bi.save(bi.build("cpu"), str(bi_dir))
    assert not (bi_dir / "README.md").exists()  # the base model's card is not copied
    st = SentenceTransformer(str(bi_dir), device="cpu")
    assert st.encode(["A man."]).shape == (1, 32) and st[0].auto_model.config.num_hidden_layers == 1


def test_the_published_cards_follow_the_run_and_skip_models_it_did_not_train(tmp_path):
    from augsbert_ray.config import validate_tree
    from augsbert_ray.metrics import RunMetrics, StageRecord
    from augsbert_ray.run_cards import publish_cards
    from augsbert_ray.stages.candidates import CandidatesResult
    from augsbert_ray.stages.evaluate import EvalResult
    from augsbert_ray.stages.gold import GoldResult
    from augsbert_ray.stages.ship import ShipResult
    from augsbert_ray.stages.silver import Shards, SilverResult
    from augsbert_ray.stages.training_result import TrainResult

    cfg = validate_tree({"name": "j", "data": {s: {"format": "stsb", "path": f"/d/sts-{s}.csv"}
                                               for s in ("train", "dev", "test")},
                         "bi_encoder": {"num_layers": 2, "gold_repeat": 2}, "labeling": {"calibration": "isotonic"}})
    shipped = ShipResult(shipped="gold_only", metric="spearman", augsbert_dev=79.0, gold_only_dev=80.11,
                         why="gold only leads AugSBERT on dev (80.11 vs 79.00)", policy="better")
    train = TrainResult(train={"steps": 10, "final_loss": 0.25, "precision": "fp32"}, train_pairs=700)
    record = lambda name, result: StageRecord(name=name, kind="stage", fingerprint="fp", seconds=1.0,  # noqa: E731
                                              reused=True, result=result)
    stages = [record("gold", GoldResult(train=500, dev=100, test=100)),
              *(record(name, train) for name in ("cross_encoder", "gold_only", "augsbert")),
              *(record(f"eval_{model}", EvalResult(model=model, scores=scores)) for model, scores in SCORES.items()),
              record("candidates", CandidatesResult(source="gold sentences", strategy="bm25", top_k=3, sentences=300,
                                                    candidates=900)),
              record("silver", SilverResult(labelled=900, silver=200, pairs_per_s=1.0, actors=1, cpus_per_actor=1.0,
                                            precision="fp32", shards=Shards(total=1, reused=0, labelled=1,
                                                                            block_size=0))),
              record("ship", shipped)]
    metrics = RunMetrics(job="j", task="regression", primary_metric="spearman", run_dir=str(tmp_path), stages=stages)
    folders = {"cross_encoder": "models/cross-encoder", "gold_only": "models/bi-encoder-gold-only",
               "target_gold": "models/bi-encoder-target-gold", "augsbert": "models/bi-encoder-augsbert",
               "ship": "models/bi-encoder"}
    for rel in folders.values():
        (tmp_path / rel).mkdir(parents=True)
    written = publish_cards(cfg, tmp_path, metrics, folders)
    assert sorted(p.parent.name for p in written) == ["bi-encoder", "bi-encoder-augsbert", "bi-encoder-gold-only",
                                                       "cross-encoder"]  # no upper bound in this job
    shipped_card = (tmp_path / "models/bi-encoder/README.md").read_text()
    assert "the Bi-encoder, gold only" in shipped_card and "| **Bi-encoder, gold only** | **80.11** |" in shipped_card
    aug = (tmp_path / "models/bi-encoder-augsbert/README.md").read_text()
    for fact in ("Silver pairs: 200 (bm25 sampling, top_k 3", "(isotonic)", "repeated 2x", "sts-train.csv",
                 "first 2 of the base model's 6 transformer layers", "Training pairs in all: 700"):
        assert fact in aug, fact
    assert front_matter(aug)["base_model"] == EMBEDDED_HUB_ID and "This is that model." not in aug
    ce = (tmp_path / "models/cross-encoder/README.md").read_text()
    assert "BinaryCrossEntropyLoss" in ce and "Silver pairs" not in ce
