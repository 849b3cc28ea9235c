"""Qwen3.5's multi-token-prediction (MTP) head, composed of transformers' own Qwen3.5 modules.

Published Qwen3.5 / Qwen3-Next checkpoints carry one extra decoder layer under ``mtp.``
(``mtp_num_hidden_layers: 1``). From the target model's final hidden state ``h_t`` (after
its last norm) and the embedding of the next token it predicts the token after that,
through the target's own (shared) embedding and LM head:

    u_t = norm(layer(fc(cat[pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)])))
    logits(x_{t+2}) = lm_head(u_t)

``layer`` is one full-attention decoder layer of the model's family (gated attention, the
model's MLP or MoE block) at RoPE position t, attending causally over the head's earlier
positions. Drafting N tokens chains the head (as vLLM's MTP drafter does): step j >= 2 of
the chain anchored at t runs at position t + j - 1 on its own previous output ``u`` in
place of ``h`` and on the previous draft token; its attention sees the step-1 entries of
positions <= t and the chain's own earlier steps, which is what a drafter's KV cache holds.

This is the reference MTP head of the tests and the model the trainer
(``scripts/train_tiny_mtp.py``) optimises; it is written from the published design and
transformers' modules only (nothing of the plugin's or vLLM's code).

Dimensions used below: B batch, T tokens, E chain elements, H hidden size, V vocabulary.
"""

import pathlib

import torch
from torch import nn

MTP_PREFIX = "mtp."


class MtpHead(nn.Module):
    """The MTP head: ``fc``, ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``layers.0``, ``norm``.

    Its ``state_dict`` keys, prefixed with ``mtp.``, are the published checkpoint names
    (``mtp.fc.weight`` [H, 2H], ``mtp.layers.0.self_attn.q_proj.weight``, ...).
    """

    def __init__(self, config, layer_cls, norm_cls, layer_idx: int):
        super().__init__()
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = norm_cls(hidden, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([layer_cls(config, layer_idx)])
        self.norm = norm_cls(hidden, eps=config.rms_norm_eps)

    @classmethod
    def for_model(cls, model) -> "MtpHead":
        """A head for a transformers causal LM (Qwen3.5 dense or MoE, Qwen3-Next): its decoder
        layer class built at one of its full-attention layer indices, its RMSNorm class."""
        config = model.config
        layer_idx = config.layer_types.index("full_attention")
        return cls(config, type(model.model.layers[layer_idx]), type(model.model.norm), layer_idx)

    def forward(self, embeds, hidden, position_embeddings, attention_mask):
        """One pass of the head over E chain elements.

        Args:
            embeds: [B, E, H] embeddings of each element's input token.
            hidden: [B, E, H] the hidden state each element continues (target's or a previous step's).
            position_embeddings: (cos, sin) of the model's rotary embedding at the elements' positions.
            attention_mask: [1, 1, E, E] additive float mask (0 where a query sees a key).

        Returns:
            [B, E, H] the normed output ``u`` (logits = the model's ``lm_head(u)``), same dtype as ``hidden``.
        """
        mixed = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        out = self.layers[0](mixed, position_embeddings=position_embeddings, attention_mask=attention_mask)
        return self.norm(out)


def chain_mask(anchors_per_step: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask [1, 1, E, E] over chain elements ordered step by step.

    ``anchors_per_step[j - 1]`` holds the anchors t of step j's elements. A step-j query
    anchored at t sees the step-1 keys anchored at <= t and the keys of steps 2..j
    anchored at t.
    """
    steps = torch.cat([torch.full_like(a, j + 1) for j, a in enumerate(anchors_per_step)])
    anchors = torch.cat(anchors_per_step)
    q_step, k_step = steps[:, None], steps[None, :]
    q_anchor, k_anchor = anchors[:, None], anchors[None, :]
    visible = ((k_step == 1) & (k_anchor <= q_anchor)) | ((k_step > 1) & (k_anchor == q_anchor) & (k_step <= q_step))
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def run_chain(model, mtp: MtpHead, tokens, hidden, anchors_per_step: list[torch.Tensor]):
    """The head over chain elements ordered step by step (see :func:`chain_mask`).

    Args:
        tokens: [B, E] each element's input token id (step j anchored at t: token t + j).
        hidden: [B, E, H] each element's input hidden state.
        anchors_per_step: the anchors of each step's elements (E in all).

    Returns:
        [B, E, H] the head's outputs; element (j, t) runs at position t + j - 1.
    """
    positions = torch.cat([a + j for j, a in enumerate(anchors_per_step)])
    embeds = model.get_input_embeddings()(tokens).to(hidden.dtype)
    position_embeddings = model.model.rotary_emb(embeds, positions[None].to(embeds.device))
    mask = chain_mask(anchors_per_step, hidden.dtype).to(hidden.device)
    return mtp(embeds, hidden, position_embeddings, mask)


def target_hidden(model, input_ids):
    """[B, T, H] the target model's final hidden states (after its last norm) of ``input_ids`` [B, T]."""
    return model.model(input_ids=input_ids).last_hidden_state


def chain_logits(model, mtp: MtpHead, input_ids, num_steps: int, hidden=None) -> list[torch.Tensor]:
    """Teacher-forced logits of every chain step over a text.

    Args:
        input_ids: [B, T] token ids.
        num_steps: K chain steps (1: the head as trained by one-step MTP).
        hidden: [B, T, H] the target's final hidden states (computed when None).

    Returns:
        K tensors; the j-th is [B, T - j, V]: at anchor t, step j's logits of token t + j + 1
        (input tokens are the text's, not drafts). The last anchor of each has no target in the text.
    """
    num_tokens = input_ids.shape[1]
    if not 1 <= num_steps < num_tokens:
        raise ValueError(f"num_steps must be in [1, {num_tokens - 1}] for {num_tokens} tokens; got {num_steps}")
    if hidden is None:
        hidden = target_hidden(model, input_ids)
    anchors = [torch.arange(num_tokens - j, device=input_ids.device) for j in range(1, num_steps + 1)]
    step_hidden = [hidden[:, : num_tokens - 1]]
    outputs = []
    for j in range(1, num_steps + 1):
        tokens = torch.cat([input_ids[:, a + s] for s, a in enumerate(anchors[:j], start=1)], dim=1)
        out = run_chain(model, mtp, tokens, torch.cat(step_hidden, dim=1), anchors[:j])
        own = out[:, -anchors[j - 1].numel():]
        outputs.append(own)
        if j < num_steps:
            step_hidden.append(own[:, : anchors[j].numel()])
    return [model.lm_head(out) for out in outputs]


@torch.no_grad()
def propose(model, mtp: MtpHead, token_ids: list[int], num_tokens: int) -> list[int]:
    """Greedy drafts of ``num_tokens`` tokens after ``token_ids``, as vLLM's MTP drafter makes them.

    ``token_ids`` ends with the target's newest token (whose hidden state is not computed
    yet): step 1 runs over every position with the target's hidden states, each further
    step on the previous draft and the previous step's output at the last anchor.
    """
    if len(token_ids) < 2:
        raise ValueError(f"token_ids must hold at least 2 tokens; got {len(token_ids)}")
    ids = torch.tensor([token_ids])
    hidden = target_hidden(model, ids[:, :-1])
    last = len(token_ids) - 2
    anchors = [torch.arange(last + 1)]
    tokens, step_hidden, drafts = ids[:, 1:], hidden, []
    for step in range(1, num_tokens + 1):
        out = run_chain(model, mtp, tokens, step_hidden, anchors)
        draft = int(model.lm_head(out[:, -1]).argmax(-1))
        drafts.append(draft)
        anchors.append(torch.tensor([last]))
        tokens = torch.cat([tokens, torch.tensor([[draft]])], dim=1)
        step_hidden = torch.cat([step_hidden, out[:, -1:]], dim=1)
    return drafts


def mtp_state_dict(mtp: MtpHead) -> dict[str, torch.Tensor]:
    """The head's tensors under their checkpoint names (``mtp.fc.weight``, ...)."""
    return {MTP_PREFIX + name: tensor for name, tensor in mtp.state_dict().items()}


def load_mtp_head(folder, model) -> MtpHead:
    """The MTP head of a checkpoint folder (its ``mtp.*`` tensors, every shard), for ``model``
    (the folder's target model, loaded by transformers), in the model's dtype."""
    from safetensors import safe_open

    tensors = {}
    for shard in sorted(pathlib.Path(folder).glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            tensors.update({k[len(MTP_PREFIX):]: f.get_tensor(k) for k in f.keys() if k.startswith(MTP_PREFIX)})
    if not tensors:
        raise ValueError(f"folder {str(folder)!r} holds no {MTP_PREFIX}* tensors")
    mtp = MtpHead.for_model(model)
    mtp.load_state_dict(_fuse_experts(tensors, mtp.state_dict()), strict=True)
    return mtp.to(model.dtype).eval()


def _fuse_experts(tensors: dict, expected: dict) -> dict:
    """Per-expert checkpoint tensors (``experts.{e}.gate_proj.weight``, ...) -> the fused
    ``experts.gate_up_proj`` [E, 2I, H] / ``experts.down_proj`` [E, H, I] of transformers'
    MoE blocks, where the head has those."""
    import torch

    for key in [k for k in expected if k.endswith(".experts.gate_up_proj")]:
        prefix = key[: -len("gate_up_proj")]
        if prefix + "0.gate_proj.weight" not in tensors:
            continue
        experts = range(expected[key].shape[0])
        tensors[key] = torch.stack([torch.cat([tensors.pop(f"{prefix}{e}.gate_proj.weight"),
                                               tensors.pop(f"{prefix}{e}.up_proj.weight")]) for e in experts])
        tensors[prefix + "down_proj"] = torch.stack([tensors.pop(f"{prefix}{e}.down_proj.weight") for e in experts])
    return tensors
