"""The shared decoder: one layer and text model from a shell's parts, the same forward for every shell,
and the causal-LM head over it."""

import types

import pytest
import torch
from torch import nn

from vllm_gdn_neuron.model.causal_lm import CausalLM, ties_word_embeddings
from vllm_gdn_neuron.model.decoder import DecoderLayer, DecoderParts, TextModel
from vllm_gdn_neuron.model.norms import ZeroCentredRMSNorm

HIDDEN = 8


class _Mixer(nn.Module):
    """Scales by a constant and records the step it was given."""

    def __init__(self, prefix: str, scale: float) -> None:
        super().__init__()
        self.prefix, self.scale, self.steps = prefix, scale, []

    def forward(self, hidden, step):
        self.steps.append(step)
        return hidden * self.scale


class _Parts(DecoderParts):
    def __init__(self, reduce=None) -> None:
        self.feed_forward_reduce = reduce

    def embedding(self, config):
        return nn.Embedding(config.vocab_size, config.hidden_size)

    def norm(self, hidden_size, eps):
        return ZeroCentredRMSNorm(hidden_size, eps=eps)

    def linear_attention(self, config, prefix):
        return _Mixer(prefix, 2.0)

    def full_attention(self, config, prefix):
        return _Mixer(prefix, 3.0)

    def dense_mlp(self, config, prefix):
        return nn.Identity()

    def sparse_moe(self, config, prefix):
        return nn.Tanh()

    def lm_head(self, config, tied_embedding):
        head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if tied_embedding is not None:
            head.weight = tied_embedding.weight
        return head

    def logits_processor(self, config):
        return _Logits()


class _Logits(nn.Module):
    """The head's matmul, then a constant shift (so the test sees the processor ran)."""

    def forward(self, lm_head, hidden):
        return lm_head(hidden) + 0.5


def _config(**changes):
    fields = dict(vocab_size=11, hidden_size=HIDDEN, rms_norm_eps=1e-6, num_hidden_layers=2,
                  layer_types=["linear_attention", "full_attention"], num_experts=0)
    return types.SimpleNamespace(**{**fields, **changes})


def test_the_layers_follow_layer_types_and_keep_the_checkpoint_names():
    model = TextModel(_config(num_experts=2, decoder_sparse_step=2, mlp_only_layers=[]), _Parts())
    names = {name for name, _ in model.named_modules()}
    assert {"layers.0.linear_attn", "layers.1.self_attn", "layers.0.input_layernorm",
            "layers.1.post_attention_layernorm", "norm", "embed_tokens"} <= names
    assert model.layers[0].mixer.prefix == "model.layers.0.linear_attn"
    assert model.layers[0].is_linear and not model.layers[1].is_linear
    assert isinstance(model.layers[0].mlp, nn.Identity) and isinstance(model.layers[1].mlp, nn.Tanh)


def test_the_forward_is_pre_norm_mixer_then_feed_forward_and_reduce_with_the_residual_in_the_norms():
    reduced = []
    parts = _Parts(reduce=lambda x: reduced.append(x) or x * 10)
    model = TextModel(_config(), parts)
    torch.manual_seed(0)
    x = torch.randn(3, HIDDEN)
    step = object()
    got = model(x, step)

    residual, hidden = None, x
    for layer, scale in zip(model.layers, (2.0, 3.0)):
        if residual is None:
            h, residual = layer.input_layernorm(hidden), hidden
        else:
            h, residual = layer.input_layernorm(hidden, residual)
        h, residual = layer.post_attention_layernorm(h * scale, residual)
        hidden = h * 10
    want, _ = model.norm(hidden, residual)
    torch.testing.assert_close(got, want)
    assert len(reduced) == 2
    assert [m.steps for m in (model.layers[0].mixer, model.layers[1].mixer)] == [[step], [step]]


def test_an_unknown_layer_type_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"layer_types\[1\] must be one of .*got 'sliding_attention'"):
        TextModel(_config(layer_types=["linear_attention", "sliding_attention"]), _Parts())


@pytest.mark.parametrize("tied", [False, True])
def test_the_causal_lm_gives_the_logits_of_the_head_over_the_decoders_hidden_states(tied):
    config = _config()
    parts = _Parts()
    model = CausalLM(config, parts, TextModel(config, parts), tie_word_embeddings=tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
    torch.manual_seed(0)
    ids = torch.tensor([3, 0, 10])
    embeds = model.embed_input_ids(ids)
    torch.testing.assert_close(embeds, model.model.embed_tokens.weight[ids])
    hidden = model.model(embeds, object())
    torch.testing.assert_close(model.compute_logits(hidden), hidden @ model.lm_head.weight.T + 0.5)


@pytest.mark.parametrize(("top", "text", "want"), [
    (None, None, False), (True, None, True), (False, None, False), (None, True, True), (False, True, True),
])
def test_a_tied_head_is_read_from_the_config_or_its_text_config(top, text, want):
    text_config = types.SimpleNamespace() if text is None else types.SimpleNamespace(tie_word_embeddings=text)
    config = types.SimpleNamespace(text_config=text_config)
    if top is not None:
        config.tie_word_embeddings = top
    assert ties_word_embeddings(config) is want
