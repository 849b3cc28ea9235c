"""The reference MTP head (``scripts/mtp_reference.py``): its checkpoint names, its chain mask,
its first step against the published formula written out here, and its two drafting paths
(sequential drafts and teacher-forced chains) against each other."""

import pytest
import torch

from scripts import build_tiny_models as builder
from scripts import mtp_reference


@pytest.fixture(scope="module")
def random_model():
    """The tiny random dense model (float32) and a random MTP head for it."""
    torch.manual_seed(0)
    model = builder.build_model("qwen3_5-dense", builder.build_tokenizer()).eval()
    mtp = mtp_reference.MtpHead.for_model(model).eval()
    with torch.no_grad():
        for name, param in mtp.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.1)  # the zero-centred norms start at 0: make them count
    return model, mtp


def test_state_dict_names_are_the_published_ones(random_model):
    model, mtp = random_model
    hidden, config = model.config.hidden_size, model.config
    shapes = {name: tuple(t.shape) for name, t in mtp_reference.mtp_state_dict(mtp).items()}
    heads, kv, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    assert shapes == {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.norm.weight": (hidden,),
        "mtp.layers.0.input_layernorm.weight": (hidden,),
        "mtp.layers.0.post_attention_layernorm.weight": (hidden,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
        "mtp.layers.0.self_attn.k_proj.weight": (kv * head_dim, hidden),
        "mtp.layers.0.self_attn.v_proj.weight": (kv * head_dim, hidden),
        "mtp.layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "mtp.layers.0.self_attn.q_norm.weight": (head_dim,),
        "mtp.layers.0.self_attn.k_norm.weight": (head_dim,),
        "mtp.layers.0.mlp.gate_proj.weight": (config.intermediate_size, hidden),
        "mtp.layers.0.mlp.up_proj.weight": (config.intermediate_size, hidden),
        "mtp.layers.0.mlp.down_proj.weight": (hidden, config.intermediate_size),
    }


def test_chain_mask_sees_step_one_up_to_the_anchor_and_its_own_chain():
    # step 1 anchored at 0..3, step 2 at 0..2, step 3 at 0..1: E = 9
    anchors = [torch.arange(4), torch.arange(3), torch.arange(2)]
    visible = mtp_reference.chain_mask(anchors, torch.float32)[0, 0] == 0
    element = {(1, t): t for t in range(4)} | {(2, t): 4 + t for t in range(3)} | {(3, t): 7 + t for t in range(2)}
    for (q_step, q_anchor), q in element.items():
        for (k_step, k_anchor), k in element.items():
            want = (k_step == 1 and k_anchor <= q_anchor) or (1 < k_step <= q_step and k_anchor == q_anchor)
            assert bool(visible[q, k]) == want, ((q_step, q_anchor), (k_step, k_anchor))


def test_first_step_is_the_published_formula(random_model):
    """u_t = norm(layer(fc(cat[norm_e(embed(x_{t+1})), norm_h(h_t)]))) at position t, causal; logits = lm_head(u)."""
    model, mtp = random_model
    ids = torch.randint(3, 500, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = mtp_reference.chain_logits(model, mtp, ids, num_steps=1)[0]
        hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
        embeds = model.model.embed_tokens(ids[:, 1:])
        x = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(embeds), mtp.pre_fc_norm_hidden(hidden)], dim=-1))
        cos_sin = model.model.rotary_emb(x, torch.arange(18)[None])
        causal = torch.full((18, 18), float("-inf")).triu(1)[None, None]
        want = model.lm_head(mtp.norm(mtp.layers[0](x, position_embeddings=cos_sin, attention_mask=causal)))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prompt_len", [2, 9])
def test_sequential_drafts_are_the_teacher_forced_chain_of_themselves(random_model, prompt_len):
    """Drafts made one by one (a drafter's way) are the argmax of the batched chain over the
    prompt followed by those drafts, at the prompt's last anchor, for every step."""
    model, mtp = random_model
    prompt = torch.randint(3, 500, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    drafts = mtp_reference.propose(model, mtp, prompt, num_tokens=3)
    ids = torch.tensor([prompt + drafts])
    with torch.no_grad():
        chain = mtp_reference.chain_logits(model, mtp, ids, num_steps=3)
    anchor = prompt_len - 2
    assert [int(chain[j][0, anchor].argmax()) for j in range(3)] == drafts


def test_bad_arguments_are_refused(random_model):
    model, mtp = random_model
    with pytest.raises(ValueError, match=r"num_steps must be in \[1, 3\] for 4 tokens; got 4"):
        mtp_reference.chain_logits(model, mtp, torch.ones(1, 4, dtype=torch.long), num_steps=4)
    with pytest.raises(ValueError, match="token_ids must hold at least 2 tokens; got 1"):
        mtp_reference.propose(model, mtp, [5], num_tokens=1)
