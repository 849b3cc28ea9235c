"""The shared decoder: one layer and text model from a shell's parts, the same forward for every shell."""

import types

import pytest
import torch
from torch import nn

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
