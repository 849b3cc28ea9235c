"""Train a tiny Qwen3.5 with its multi-token-prediction head on a synthetic corpus.

Run from the repository root (it imports its siblings in ``scripts/``)::

    python -m scripts.train_tiny_mtp                          # -> configs/trained/qwen3_5-tiny-mtp (13.5 min at load 9)
    python -m scripts.train_tiny_mtp --out /tmp/m --steps 50  # a quick, worse one elsewhere
    python -m scripts.train_tiny_mtp --evaluate-only          # the committed checkpoint's metrics again
    python -m scripts.train_tiny_mtp --qwen3-next-out /tmp/q  # the same weights in the Qwen3-Next layout

The model has the tiny random model's shapes (``build_tiny_models._COMMON``: hidden 64,
three GatedDeltaNet layers and one gated-attention layer, GDN heads 2/4 with Dk 32 != Dv
16, a 512-token byte-level BPE with a ChatML chat template) and transformers' own
``Qwen3_5ForCausalLM``; the MTP head is ``mtp_reference.MtpHead`` (one full-attention
decoder layer of the same family, shared embedding and LM head). Both train together:
loss = next-token loss + MTP_WEIGHT x the mean of the head's losses over MTP_STEPS
chained steps (step j predicts token t + j + 1, as a drafter of j tokens uses it), so
drafts beyond the first are trained too.

The corpus (:func:`documents`) is templated lines with learnable structure: counting up
and down, days and months in order, copies of a random word list, a count that drops by
one, successor sums, and ChatML conversations asking for them. Most tokens follow from
the ones before, so a tiny model predicts them and MTP drafts are mostly accepted;
the random slots (where a count starts, which words are copied) stay unpredictable.

Training is deterministic for a given seed and thread count (fixed steps, seeded data
and initialisation). The checkpoint folder is the published layout: ``config.json``
(``Qwen3_5ForCausalLM``, ``mtp_num_hidden_layers: 1``, tied embeddings),
``model.safetensors`` (bf16; the base model and the ``mtp.*`` tensors), the tokenizer
files, and ``tiny-model.json`` with the training record and the held-out metrics
(measured on the saved bf16 weights, in float32).
"""

import argparse
import json
import pathlib
import random
import time

from scripts import build_tiny_models as builder
from scripts import mtp_reference

REPO = pathlib.Path(__file__).resolve().parents[1]
NAME = "qwen3_5-tiny-mtp"
DEFAULT_OUT = REPO / "configs" / "trained" / NAME
SEED = 0
HELD_OUT_SEED = 1
STEPS = 350
BATCH = 32
SEQ_LEN = 64
LR = 4e-3
WARMUP = 30
MTP_STEPS = 3
MTP_WEIGHT = 0.5
TRAIN_DOCS = 6000
HELD_OUT_DOCS = 200
INTERMEDIATE_SIZE = 128

# --------------------------------------------------------------------------------------------
# The corpus
# --------------------------------------------------------------------------------------------

NUMBERS = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
           "sixteen seventeen eighteen nineteen twenty").split()
DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
MONTHS = "january february march april may june july august september october november december".split()
WORDS = "red green blue river mountain city road house tree cloud rain sun moon star light stone".split()
NAMES = "anna ben clara dan eva finn".split()
FRUITS = "apples pears plums figs lemons".split()


def _run(seq, start, length):
    return " ".join(seq[(start + i) % len(seq)] for i in range(length))


def _count_up(rng):
    a = rng.randrange(0, 15)
    b = rng.randrange(a + 2, min(a + 12, len(NUMBERS)))
    return f"count from {NUMBERS[a]} to {NUMBERS[b]}", " ".join(NUMBERS[a:b + 1])


def _count_down(rng):
    b = rng.randrange(3, len(NUMBERS))
    a = rng.randrange(max(0, b - 10), b - 1)
    return f"count down from {NUMBERS[b]} to {NUMBERS[a]}", " ".join(reversed(NUMBERS[a:b + 1]))


def _cycle(rng, seq, noun):
    start, length = rng.randrange(len(seq)), rng.randrange(3, len(seq) + 1)
    first, last = seq[start], seq[(start + length - 1) % len(seq)]
    return f"the {noun} from {first} to {last}", _run(seq, start, length)


def _sum(rng):
    a, k = rng.randrange(0, 17), rng.randrange(1, 4)
    return f"what is {NUMBERS[a]} plus {NUMBERS[k - 1]}", f"{NUMBERS[a]} plus {NUMBERS[k - 1]} is {NUMBERS[a + k]}"


def _line(rng) -> str:
    """One plain-text document line."""
    kind = rng.randrange(8)
    if kind == 0:
        ask, answer = _count_up(rng)
        return f"{ask}: {answer}."
    if kind == 1:
        ask, answer = _count_down(rng)
        return f"{ask}: {answer}."
    if kind == 2:
        ask, answer = _cycle(rng, DAYS, "days")
        return f"{ask}: {answer}."
    if kind == 3:
        ask, answer = _cycle(rng, MONTHS, "months")
        return f"{ask}: {answer}."
    if kind == 4:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 5)))
        return f"repeat {words}: {words}."
    if kind == 5:
        name, fruit, n = rng.choice(NAMES), rng.choice(FRUITS), rng.randrange(1, 20)
        return (f"{name} has {NUMBERS[n]} {fruit}. {name} eats one. "
                f"now {name} has {NUMBERS[n - 1]} {fruit}.")
    if kind == 6:
        day = rng.randrange(len(DAYS))
        return f"the day after {DAYS[day]} is {DAYS[(day + 1) % len(DAYS)]}."
    return _sum(rng)[1] + "."


def _chat(rng) -> str:
    """One ChatML conversation (the tokenizer's chat template's format)."""
    ask, answer = rng.choice((_count_up, _count_down, _sum))(rng)
    return f"<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n{answer}.<|im_end|>"


def documents(num_docs: int, seed: int) -> list[str]:
    """``num_docs`` corpus documents (one in six a conversation), deterministic in ``seed``."""
    rng = random.Random(seed)
    return [_chat(rng) if rng.randrange(6) == 0 else _line(rng) for _ in range(num_docs)]


def token_stream(tokenizer, docs: list[str]):
    """All documents' token ids, each document followed by a newline, as one long tensor."""
    import torch

    return torch.tensor(tokenizer("\n".join(docs) + "\n")["input_ids"], dtype=torch.long)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------

def model_config(tokenizer):
    """``Qwen3_5TextConfig`` of the tiny model: the tiny models' shapes, a trainable init."""
    import transformers as tf

    return tf.Qwen3_5TextConfig(**builder._text_kwargs(
        tokenizer, intermediate_size=INTERMEDIATE_SIZE, tie_word_embeddings=True, initializer_range=0.02,
        mtp_num_hidden_layers=1))


def losses(model, mtp, batch):
    """(next-token loss, [loss of each chained MTP step]) of a [B, T] batch."""
    import torch.nn.functional as F

    hidden = mtp_reference.target_hidden(model, batch)
    logits = model.lm_head(hidden)
    base = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
    steps = []
    for j, step_logits in enumerate(mtp_reference.chain_logits(model, mtp, batch, MTP_STEPS, hidden), start=1):
        target = batch[:, j + 1:]
        steps.append(F.cross_entropy(step_logits[:, : target.shape[1]].flatten(0, 1), target.flatten()))
    return base, steps


def train(tokenizer, steps: int, seed: int, log_every: int = 50):
    """The trained (model, mtp head) in float32, and the training record."""
    import math

    import torch
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.Qwen3_5ForCausalLM(model_config(tokenizer))
    mtp = mtp_reference.MtpHead.for_model(model)
    stream = token_stream(tokenizer, documents(TRAIN_DOCS, seed))
    params = list(model.parameters()) + list(mtp.parameters())
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.01, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARMUP) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    mtp.train()
    start = time.perf_counter()
    for step in range(steps):
        offsets = torch.randint(0, stream.numel() - SEQ_LEN, (BATCH,), generator=generator)
        batch = torch.stack([stream[o:o + SEQ_LEN] for o in offsets.tolist()])
        base, mtp_steps = losses(model, mtp, batch)
        loss = base + MTP_WEIGHT * sum(mtp_steps) / len(mtp_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if step % log_every == 0 or step == steps - 1:
            print(f"[train] step {step:4d} loss {base.item():.3f} mtp "
                  + " ".join(f"{x.item():.3f}" for x in mtp_steps) + f" ({time.perf_counter() - start:.0f} s)",
                  flush=True)
    record = dict(seed=seed, steps=steps, batch=BATCH, seq_len=SEQ_LEN, mtp_steps=MTP_STEPS, mtp_weight=MTP_WEIGHT,
                  train_seconds=round(time.perf_counter() - start, 1), threads=torch.get_num_threads(),
                  final_train_loss=round(base.item(), 4), final_train_mtp_losses=[round(x.item(), 4) for x in mtp_steps])
    return model.eval(), mtp.eval(), record


# --------------------------------------------------------------------------------------------
# Held-out metrics
# --------------------------------------------------------------------------------------------

def held_out_batch(tokenizer, num_docs: int = HELD_OUT_DOCS):
    """[B, SEQ_LEN] windows of held-out documents (their own seed), back to back."""
    stream = token_stream(tokenizer, documents(num_docs, HELD_OUT_SEED))
    rows = stream.numel() // SEQ_LEN
    return stream[: rows * SEQ_LEN].view(rows, SEQ_LEN)


def evaluate(model, mtp, batch) -> dict:
    """Held-out metrics in float32 on ``batch`` [B, T].

    ``mtp_top1``: the head's top-1 accuracy of the text's token t + j + 1 (step j, text
    tokens as inputs); ``mtp_agrees_with_base``: the share where its top-1 equals the base
    model's own top-1 at that position given the text before it (the acceptance of a
    greedy draft at position j when the drafts so far were right).
    """
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        hidden = mtp_reference.target_hidden(model, batch)
        logits = model.lm_head(hidden)
        base_pred = logits.argmax(-1)
        metrics = dict(
            held_out_tokens=int(batch.numel()),
            base_loss=F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten()).item(),
            base_top1=(base_pred[:, :-1] == batch[:, 1:]).float().mean().item(),
            mtp_loss=[], mtp_top1=[], mtp_agrees_with_base=[])
        for j, step_logits in enumerate(mtp_reference.chain_logits(model, mtp, batch, MTP_STEPS, hidden), start=1):
            target = batch[:, j + 1:]
            step_logits = step_logits[:, : target.shape[1]]
            pred = step_logits.argmax(-1)
            metrics["mtp_loss"].append(F.cross_entropy(step_logits.flatten(0, 1), target.flatten()).item())
            metrics["mtp_top1"].append((pred == target).float().mean().item())
            metrics["mtp_agrees_with_base"].append((pred == base_pred[:, j:-1]).float().mean().item())
    return {k: [round(x, 4) for x in v] if isinstance(v, list) else (round(v, 4) if isinstance(v, float) else v)
            for k, v in metrics.items()}


def load(folder):
    """(tokenizer, float32 model, float32 MTP head) of a checkpoint folder written here."""
    import torch
    import transformers as tf

    tokenizer = tf.AutoTokenizer.from_pretrained(folder)
    model = tf.Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return tokenizer, model, mtp_reference.load_mtp_head(folder, model)


# --------------------------------------------------------------------------------------------
# The checkpoint
# --------------------------------------------------------------------------------------------

def save(model, mtp, tokenizer, record: dict, target: pathlib.Path) -> pathlib.Path:
    """Write the checkpoint folder (bf16) aside, evaluate it as saved, then rename it into place."""
    import torch
    from safetensors.torch import load_file, save_file

    staging = builder.staging_folder(target)
    model.to(torch.bfloat16).save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    weights = staging / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.update({k: v.to(torch.bfloat16).contiguous() for k, v in mtp_reference.mtp_state_dict(mtp).items()})
    save_file(tensors, str(weights), metadata={"format": "pt"})
    _, saved_model, saved_mtp = load(staging)
    record = dict(name=NAME, **record, held_out=evaluate(saved_model, saved_mtp, held_out_batch(tokenizer)))
    (staging / "tiny-model.json").write_text(json.dumps(record, indent=1) + "\n")
    return builder.move_into_place(staging, target)


QWEN3_NEXT_EXPERTS = 2
QWEN3_NEXT_SHARED_SIZE = 32


def pack_qwen3_next(tensors: dict, config) -> dict:
    """Qwen3.5 tensors -> the same function in the Qwen3-Next layout.

    - GatedDeltaNet: per-key-head ``in_proj_qkvz`` / ``in_proj_ba`` (conv, norms, A, dt unchanged).
    - MLPs: vLLM's Qwen3-Next serves MoE layers only, so each dense MLP becomes a MoE block
      that computes it exactly: QWEN3_NEXT_EXPERTS copies of it as the routed experts, one
      routed per token with its weight renormalised (to exactly 1), and a shared expert
      whose output projection is zero.
    - ``lm_head.weight`` written out (Qwen3-Next does not tie it); every other name is the same.
    """
    import torch

    hk, dk, dv = config.linear_num_key_heads, config.linear_key_head_dim, config.linear_value_head_dim
    ratio = config.linear_num_value_heads // hk
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(".in_proj_qkv.weight"):
            prefix = name[: -len("in_proj_qkv.weight")]
            q, k, v = tensor.split([hk * dk, hk * dk, hk * ratio * dv])
            z = tensors[prefix + "in_proj_z.weight"]
            groups = [part.reshape(hk, -1, tensor.shape[-1]) for part in (q, k, v, z)]
            out[prefix + "in_proj_qkvz.weight"] = torch.cat(groups, dim=1).reshape(-1, tensor.shape[-1]).contiguous()
            b, a = (tensors[prefix + f"in_proj_{x}.weight"].reshape(hk, ratio, -1) for x in "ba")
            out[prefix + "in_proj_ba.weight"] = torch.cat([b, a], dim=1).reshape(-1, tensor.shape[-1]).contiguous()
        elif name.endswith(".mlp.gate_proj.weight"):
            prefix = name[: -len("gate_proj.weight")]
            hidden = tensor.shape[-1]
            for expert in range(QWEN3_NEXT_EXPERTS):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    out[f"{prefix}experts.{expert}.{proj}.weight"] = tensors[f"{prefix}{proj}.weight"].clone()
            out[prefix + "gate.weight"] = torch.zeros(QWEN3_NEXT_EXPERTS, hidden, dtype=tensor.dtype)
            for proj, shape in (("gate_proj", (QWEN3_NEXT_SHARED_SIZE, hidden)), ("up_proj", (QWEN3_NEXT_SHARED_SIZE, hidden)),
                                ("down_proj", (hidden, QWEN3_NEXT_SHARED_SIZE))):
                out[f"{prefix}shared_expert.{proj}.weight"] = torch.zeros(shape, dtype=tensor.dtype)
            out[prefix + "shared_expert_gate.weight"] = torch.zeros(1, hidden, dtype=tensor.dtype)
        elif not name.endswith((".in_proj_z.weight", ".in_proj_b.weight", ".in_proj_a.weight",
                                ".mlp.up_proj.weight", ".mlp.down_proj.weight")):
            out[name] = tensor
    out.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"].clone())
    return out


def write_qwen3_next_layout(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """The checkpoint of ``source`` as ``Qwen3NextForCausalLM`` (:func:`pack_qwen3_next`;
    ``num_nextn_predict_layers: 1``, the MTP head included), for vLLM's built-in Qwen3-Next."""
    import transformers as tf
    from safetensors.torch import load_file, save_file

    tokenizer = tf.AutoTokenizer.from_pretrained(source)
    text = tf.AutoConfig.from_pretrained(source)
    shapes = {key: getattr(text, key) for key in builder._COMMON}  # the source's own, scaled or not
    config = tf.Qwen3NextConfig(**builder._text_kwargs(
        tokenizer, **shapes, intermediate_size=text.intermediate_size, tie_word_embeddings=False,
        num_experts=QWEN3_NEXT_EXPERTS, num_experts_per_tok=1,
        norm_topk_prob=True, moe_intermediate_size=text.intermediate_size,
        shared_expert_intermediate_size=QWEN3_NEXT_SHARED_SIZE, decoder_sparse_step=1, mlp_only_layers=[],
        layer_types=text.layer_types, num_nextn_predict_layers=1, dtype="bfloat16"))
    config.architectures = ["Qwen3NextForCausalLM"]
    staging = builder.staging_folder(target)
    staging.mkdir(parents=True)
    config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    save_file(pack_qwen3_next(load_file(str(source / "model.safetensors")), text), str(staging / "model.safetensors"),
              metadata={"format": "pt"})
    return builder.move_into_place(staging, target)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="checkpoint folder to write")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (results depend on it; one is faster on a loaded machine)")
    parser.add_argument("--evaluate-only", action="store_true", help="print the metrics of the folder at --out")
    parser.add_argument("--qwen3-next-out", type=pathlib.Path,
                        help="write the --out checkpoint in the Qwen3-Next layout there (no training)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.qwen3_next_out:
        print(f"[train] {write_qwen3_next_layout(args.out, args.qwen3_next_out)}")
        return
    if args.evaluate_only:
        tokenizer, model, mtp = load(args.out)
        print(json.dumps(evaluate(model, mtp, held_out_batch(tokenizer)), indent=1))
        return
    tokenizer = builder.build_tokenizer(texts=documents(TRAIN_DOCS, args.seed))
    model, mtp, record = train(tokenizer, args.steps, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    folder = save(model, mtp, tokenizer, record, args.out)
    print(f"[train] {folder}: " + (folder / "tiny-model.json").read_text())


if __name__ == "__main__":
    main()
