"""The MTP head's model-definition parts: its config check, checkpoint names and input norms."""

import types

import pytest
import torch

from vllm_gdn_neuron.model.checkpoint import mtp_tensor_name
from vllm_gdn_neuron.model.mtp import MTPInputNorms, check_mtp_config, mtp_num_layers


@pytest.mark.parametrize(
    ("fields", "layers"),
    [(dict(mtp_num_hidden_layers=1), 1), (dict(num_nextn_predict_layers=1), 1), ({}, 0),
     (dict(mtp_num_hidden_layers=None, num_nextn_predict_layers=2), 2)],
)
def test_mtp_layer_count_is_read_from_either_field(fields, layers):
    assert mtp_num_layers(types.SimpleNamespace(**fields)) == layers


@pytest.mark.parametrize(
    ("fields", "message"),
    [({}, "mtp_num_hidden_layers must be one of \\(1,\\).*got mtp_num_hidden_layers=0"),
     (dict(mtp_num_hidden_layers=2), "got mtp_num_hidden_layers=2"),
     (dict(num_nextn_predict_layers=0), "num_nextn_predict_layers must be one of \\(1,\\).*got num_nextn_predict_layers=0")],
)
def test_a_head_this_definition_cannot_build_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        check_mtp_config(types.SimpleNamespace(**fields))


@pytest.mark.parametrize(
    ("checkpoint", "drafter"),
    [
        ("mtp.fc.weight", "model.fc.weight"),
        ("mtp.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("mtp.layers.0.mlp.experts.3.gate_proj.weight", "model.layers.0.mlp.experts.3.gate_proj.weight"),
        ("model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("lm_head.weight", "lm_head.weight"),
        ("model.layers.3.self_attn.q_proj.weight", None),
        ("model.language_model.norm.weight", None),
        ("model.visual.blocks.0.attn.qkv.weight", None),
    ],
)
def test_the_drafter_takes_the_head_embedding_and_lm_head_only(checkpoint, drafter):
    assert mtp_tensor_name(checkpoint) == drafter


def test_input_norms_normalise_each_half_and_put_the_embedding_first():
    norms = MTPInputNorms(8, eps=1e-6)
    with torch.no_grad():
        norms.pre_fc_norm_embedding.weight.fill_(1.0)   # zero-centred: scale 2
        norms.pre_fc_norm_hidden.weight.fill_(-0.5)     # scale 0.5
    embeds, hidden = 3 * torch.ones(2, 8), -torch.ones(2, 8)
    out = norms(embeds, hidden)
    torch.testing.assert_close(out, torch.cat([2 * torch.ones(2, 8), -0.5 * torch.ones(2, 8)], -1), rtol=0,
                               atol=1e-5)


def test_input_norms_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match="hidden_states: expected the shape of the token embeddings \\(2, 8\\), "
                                         "got \\(3, 8\\)"):
        MTPInputNorms(8, eps=1e-6)(torch.ones(2, 8), torch.ones(3, 8))
