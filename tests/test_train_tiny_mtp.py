"""The committed trained checkpoint (``configs/trained/qwen3_5-tiny-mtp``, written by
``scripts/train_tiny_mtp.py``): its layout, that transformers loads it and continues held-out
templates correctly, that its MTP head reaches the held-out accuracy the trainer recorded, and
that its Qwen3-Next layout is the same model. The training itself runs only in the slow test."""

import json

import pytest
import torch
from safetensors import safe_open

from scripts import mtp_reference
from scripts import train_tiny_mtp as trainer

FOLDER = trainer.DEFAULT_OUT
RECORD = json.loads((FOLDER / "tiny-model.json").read_text())


@pytest.fixture(scope="module")
def trained():
    """(tokenizer, float32 model, float32 MTP head) of the committed checkpoint."""
    return trainer.load(FOLDER)


def _tensors(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {name: (f.get_slice(name).get_dtype(), tuple(f.get_slice(name).get_shape())) for name in f.keys()}


def test_checkpoint_is_the_published_layout():
    config = json.loads((FOLDER / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert config["mtp_num_hidden_layers"] == 1
    assert config["tie_word_embeddings"] is True
    assert set(config["layer_types"]) == {"linear_attention", "full_attention"}
    tensors = _tensors(FOLDER)
    hidden = config["hidden_size"]
    assert {dtype for dtype, _ in tensors.values()} == {"BF16"}
    assert tensors["mtp.fc.weight"][1] == (hidden, 2 * hidden)
    mtp_names = {name for name in tensors if name.startswith("mtp.")}
    assert {name.split(".")[1] for name in mtp_names} == {
        "fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "layers", "norm"}
    assert {name.split(".")[2] for name in mtp_names if name.startswith("mtp.layers.")} == {"0"}
    assert "lm_head.weight" not in tensors  # tied to model.embed_tokens, shared by the MTP head
    size = sum(path.stat().st_size for path in FOLDER.iterdir())
    assert size < 2 * 2**20, size
    assert {"tokenizer.json", "tokenizer_config.json"} <= {path.name for path in FOLDER.iterdir()}


@pytest.mark.parametrize("prompt, continuation", [
    ("count from three to nine:", " three four five six seven eight nine."),
    ("count down from twelve to six:", " twelve eleven ten nine eight seven six."),
    ("the months from october to march:", " october november december january february march."),
    ("the days from friday to tuesday:", " friday saturday sunday monday tuesday."),
    ("the day after sunday is", " monday."),
])
def test_greedy_text_continues_held_out_templates(trained, prompt, continuation):
    tokenizer, model, _ = trained
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    want = tokenizer(continuation)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=len(want), do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1]:]) == continuation


def test_mtp_head_reaches_the_recorded_held_out_accuracy(trained):
    tokenizer, model, mtp = trained
    metrics = trainer.evaluate(model, mtp, trainer.held_out_batch(tokenizer))
    recorded = RECORD["held_out"]
    assert metrics["held_out_tokens"] == recorded["held_out_tokens"]
    for key in ("base_top1", "mtp_top1", "mtp_agrees_with_base"):
        torch.testing.assert_close(torch.tensor(metrics[key]), torch.tensor(recorded[key]), rtol=0, atol=0.01)
    # not noise: the first draft is right for most held-out tokens
    assert metrics["mtp_top1"][0] > 0.6 and metrics["mtp_agrees_with_base"][0] > 0.7, metrics


def test_drafts_of_a_held_out_count_are_its_next_tokens(trained):
    tokenizer, model, mtp = trained
    ids = tokenizer("count from four to eleven: four five six")["input_ids"]
    assert tokenizer.decode(mtp_reference.propose(model, mtp, ids, num_tokens=3)) == " seven eight nine"


def test_qwen3_next_layout_is_the_same_model(trained, tmp_path):
    import transformers as tf

    tokenizer, model, mtp = trained
    folder = trainer.write_qwen3_next_layout(FOLDER, tmp_path / "next")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"] and config["num_nextn_predict_layers"] == 1
    names = set(_tensors(folder))
    assert "lm_head.weight" in names and not any(".in_proj_qkv." in n or ".in_proj_z." in n for n in names)
    next_model = tf.Qwen3NextForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    next_mtp = mtp_reference.load_mtp_head(folder, next_model)
    ids = trainer.held_out_batch(tokenizer)[:2]
    with torch.no_grad():
        torch.testing.assert_close(next_model(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
        for got, want in zip(mtp_reference.chain_logits(next_model, next_mtp, ids, 2),
                             mtp_reference.chain_logits(model, mtp, ids, 2)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_corpus_is_deterministic_and_held_out_is_new():
    assert trainer.documents(50, trainer.SEED) == trainer.documents(50, trainer.SEED)
    train = set(trainer.documents(trainer.TRAIN_DOCS, trainer.SEED))
    held_out = trainer.documents(trainer.HELD_OUT_DOCS, trainer.HELD_OUT_SEED)
    assert any(doc not in train for doc in held_out)


@pytest.mark.slow
def test_training_writes_a_checkpoint(tmp_path):
    """A few steps of the real script into a temporary folder (the committed one: 350 steps)."""
    folder = tmp_path / trainer.NAME
    trainer.main(["--out", str(folder), "--steps", "3", "--threads", "1"])
    record = json.loads((folder / "tiny-model.json").read_text())
    assert record["steps"] == 3 and len(record["held_out"]["mtp_top1"]) == trainer.MTP_STEPS
    assert set(_tensors(folder)) == set(_tensors(FOLDER))
