"""``scripts/scale_checkpoint.py``: the trained tiny checkpoint deepened and with wider GDN heads
computes the same function (transformers, float32: logits and the MTP head's chained drafts),
also through its Qwen3-Next layout, and bad sizes are refused before anything is written."""

import json

import pytest
import torch

from scripts import mtp_reference
from scripts import scale_checkpoint as scale
from scripts import train_tiny_mtp as trainer

SOURCE = trainer.DEFAULT_OUT


@pytest.fixture(scope="module")
def reference():
    """(held-out ids, float32 logits, the MTP head's two chained steps' logits) of the source."""
    tokenizer, model, mtp = trainer.load(SOURCE)
    ids = trainer.held_out_batch(tokenizer)[:2]
    with torch.no_grad():
        return ids, model(ids).logits, mtp_reference.chain_logits(model, mtp, ids, 2)


def _outputs(folder, ids, model_class=None):
    import transformers as tf

    model = (model_class or tf.Qwen3_5ForCausalLM).from_pretrained(folder, dtype=torch.float32).eval()
    mtp = mtp_reference.load_mtp_head(folder, model)
    with torch.no_grad():
        return model(ids).logits, mtp_reference.chain_logits(model, mtp, ids, 2)


def _assert_same(got, want, tol):
    torch.testing.assert_close(got[0], want[1], rtol=tol, atol=tol)
    for got_step, want_step in zip(got[1], want[2]):
        torch.testing.assert_close(got_step, want_step, rtol=tol, atol=tol)
    assert torch.equal(got[0].argmax(-1), want[1].argmax(-1))


def test_deepened_checkpoint_is_the_same_function(reference, tmp_path):
    folder = scale.deepen(SOURCE, tmp_path / "deep", 10)
    config = json.loads((folder / "config.json").read_text())
    source_types = json.loads((SOURCE / "config.json").read_text())["layer_types"]
    assert config["num_hidden_layers"] == 10
    assert config["layer_types"] == (source_types * 3)[:10]
    _assert_same(_outputs(folder, reference[0]), reference, 1e-5)


def test_wider_value_heads_are_the_same_function(reference, tmp_path):
    folder = scale.widen_value_heads(SOURCE, tmp_path / "wide", 48)
    assert json.loads((folder / "config.json").read_text())["linear_value_head_dim"] == 48
    _assert_same(_outputs(folder, reference[0]), reference, 1e-4)


def test_wider_key_heads_match_within_the_smaller_epsilon(reference, tmp_path):
    """The one transform that is not exact: every RMSNorm's epsilon is halved."""
    folder = scale.widen_key_heads(SOURCE, tmp_path / "wide", 64)
    config = json.loads((folder / "config.json").read_text())
    assert config["linear_key_head_dim"] == 64
    assert config["rms_norm_eps"] == json.loads((SOURCE / "config.json").read_text())["rms_norm_eps"] / 2
    _assert_same(_outputs(folder, reference[0]), reference, 5e-3)


def test_built_in_kernel_shapes_in_the_qwen3_next_layout(reference, tmp_path):
    """What the benchmark serves to vLLM's built-in: Dk = Dv = 64, 8 layers, Qwen3-Next layout."""
    import transformers as tf

    folder = scale.scale(SOURCE, tmp_path / "scaled", key_head_dim=64, value_head_dim=64, num_layers=8)
    qwen3_next = trainer.write_qwen3_next_layout(folder, tmp_path / "next")
    config = json.loads((qwen3_next / "config.json").read_text())
    assert (config["linear_key_head_dim"], config["linear_value_head_dim"], config["num_hidden_layers"]) == (64, 64, 8)
    _assert_same(_outputs(qwen3_next, reference[0], tf.Qwen3NextForCausalLM), reference, 5e-3)


@pytest.mark.parametrize("call, message", [
    (lambda t: scale.deepen(SOURCE, t, 3), "num_layers must be at least the source's 4 layers, got 3"),
    (lambda t: scale.widen_value_heads(SOURCE, t, 24), "multiple of the source's linear_value_head_dim 16, got 24"),
    (lambda t: scale.widen_key_heads(SOURCE, t, 16), "multiple of the source's linear_key_head_dim 32, got 16"),
])
def test_bad_sizes_are_refused_before_writing(tmp_path, call, message):
    target = tmp_path / "out"
    with pytest.raises(ValueError, match=message):
        call(target)
    assert not target.exists()
