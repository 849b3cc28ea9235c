"""Multi-token prediction (``--speculative-config '{"method": "mtp", ...}'``) through the plugin.

fp32, greedy: the ids with the MTP drafter equal the ids without it, exactly, for 1, 2 and 3
speculative tokens, one request alone and 24 at once of 1..300 prompt tokens (chunked
prefill at ``max_num_batched_tokens=128``, steps mixing verify rows with prefills). The tiny
models' random MTP heads draft tokens the target rejects almost everywhere;
``qwen3_5-dense-mtp-repeat`` (a head that drafts its input token again) gets drafts accepted,
so steps keep more than one token; with it, 16 sequences of ~120 tokens on a 2 MiB KV + state
cache make the scheduler preempt running sequences and hand their state slots to others
(the preemption counter is asserted), and the ids still equal those without a drafter.
bf16 (repeat head, 3 speculative tokens): greedy ids equal transformers' bf16 ids up to the
first near-tie (``oracle``'s rule); so do those of the trained checkpoint with GDN heads of 64
(``scripts/scale_checkpoint.py``) whose verify rows run vLLM's speculative decode kernel.
Seeded sampling (the trained checkpoint and its own head, 3 speculative tokens, most drafts
accepted; temperature 0.7): at each of 4 generated
positions, 1200 draws with the drafter and 1200 without (disjoint seeds) pass a chi-square
homogeneity test, all positions together at a false-alarm rate of 1e-4. Every other checkpoint
layout loads its head (MoE, Qwen3-Next, both vision-language layouts) and greedy ids equal
transformers' without a drafter; the head's output on the first drafting step of a 40-token
prompt equals the same head composed from transformers' modules (its full-attention decoder
layer, RMSNorms and Linear) on the same inputs. Speculative decoding with prefix caching, and
``mtp`` on a checkpoint without an MTP head, are refused with a message naming the setting.
"""

import json
import pathlib
import random

import pytest
import torch

from scripts import build_tiny_models as builder
from tests.support.engines import engine
from tests.support.oracle import assert_greedy_matches, chi2_homogeneity, hf_greedy

MAX_NEW_TOKENS = 12
LENGTHS = (1, 2, 5, 17, 40, 90, 130, 300)


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(LENGTHS[i % len(LENGTHS)])] for i in range(count)]


ALONE = _prompts(1, seed=3)[0:1]
TOGETHER = _prompts(24, seed=4)


def _mtp(n: int) -> dict:
    return dict(speculative_config={"method": "mtp", "num_speculative_tokens": n})


def _greedy(llm, prompts: list[list[int]], max_new_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _counter(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name and hasattr(m, "value"))


def _accepted_per_position(llm) -> list[int]:
    vectors = [m.values for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos"]
    return [sum(v) for v in zip(*vectors)] if vectors else []


def _stats(llm) -> dict:
    return {
        "drafts": _counter(llm, "vllm:spec_decode_num_draft_tokens"),
        "accepted": _counter(llm, "vllm:spec_decode_num_accepted_tokens"),
        "per_position": _accepted_per_position(llm),
        "preemptions": _counter(llm, "vllm:num_preemptions"),
    }


# Enough sequences that each crosses into a new 128-token KV block while it decodes, on a cache
# too small (2 MiB of KV + state at max_model_len 512) for all of them: the scheduler preempts
# running sequences (their KV blocks and state slots go to others) and recomputes them later.
PREEMPTED = [[random.Random(8 + i).randrange(3, 512) for _ in range(120 + i % 7)] for i in range(16)]
PREEMPTING = dict(kv_cache_memory_bytes=2 * 2**20, max_model_len=512)


def _run(model_dir: str, engine_kwargs: dict, batches: tuple = (ALONE, TOGETHER)):
    """Greedy ids of each batch and the engine's spec-decode and preemption counters."""
    kwargs = dict(dtype="float32", enable_prefix_caching=False, max_num_seqs=32, disable_log_stats=False)
    with engine(model_dir, **{**kwargs, **engine_kwargs}) as llm:
        ids = [_greedy(llm, batch) for batch in batches]
        stats = _stats(llm)
    return ids, stats


@pytest.fixture(scope="module")
def repeat_head(tmp_path_factory) -> str:
    """``qwen3_5-dense`` (the same target) with a head whose drafts get accepted where the target repeats a token."""
    return str(builder.build("qwen3_5-dense", tmp_path_factory.mktemp("mtp-repeat"), mtp_head_kind="repeat"))


@pytest.fixture(scope="module")
def without_mtp(repeat_head):
    """Greedy ids of the target without a drafter: ALONE, TOGETHER, PREEMPTED."""
    return _run(repeat_head, {}, batches=(ALONE, TOGETHER, PREEMPTED))[0]


@pytest.mark.slow
@pytest.mark.parametrize("num_speculative_tokens", [1, 2, 3])
def test_greedy_ids_with_mtp_equal_ids_without(tiny_model, without_mtp, num_speculative_tokens):
    """The tiny model's random head: drafts rejected almost everywhere."""
    ids, stats = _run(tiny_model("qwen3_5-dense"), _mtp(num_speculative_tokens))
    assert ids == without_mtp[:2]
    assert stats["drafts"] > 0, "no draft was verified: nothing was tested"


@pytest.mark.slow
def test_accepted_drafts_change_no_output(repeat_head, without_mtp):
    """Verify steps that keep 2 to 4 tokens advance the states by all of them."""
    ids, stats = _run(repeat_head, _mtp(3))
    assert ids == without_mtp[:2]
    print(f"\nrepeat head, 3 speculative tokens: {stats['accepted']:.0f} of {stats['drafts']:.0f} drafts "
          f"accepted, per position {stats['per_position']}")
    assert stats["accepted"] > 0, "no draft was accepted: the multi-token state advance was not tested"


@pytest.mark.slow
def test_preemption_and_slot_reuse_with_accepted_drafts_change_no_output(repeat_head, without_mtp):
    ids, stats = _run(repeat_head, {**_mtp(2), **PREEMPTING}, batches=(PREEMPTED,))
    print(f"\npreempting cache, repeat head, 2 speculative tokens: {stats['preemptions']:.0f} preemptions, "
          f"{stats['accepted']:.0f} of {stats['drafts']:.0f} drafts accepted")
    assert stats["preemptions"] > 0, "the cache was large enough: nothing was preempted, nothing was tested"
    assert stats["accepted"] > 0, "no draft was accepted: the multi-token state advance was not tested"
    assert ids == without_mtp[2:]


# Seeded sampling on the trained checkpoint (its own MTP head gets most drafts accepted):
# DRAWS requests of SAMPLED_PROMPT, SAMPLED_STEPS tokens each at temperature 0.7 (no top-k /
# top-p), one seed each; the engine with 3 speculative tokens and the one without draw with
# disjoint seeds, so the two samples are independent. Big batches: few engine steps.
SAMPLED_PROMPT = "the days from"
DRAWS = 1200
SAMPLED_STEPS = 4
SEEDS_WITHOUT, SEEDS_WITH = 1000, 1000 + DRAWS
# The chance that the test fails although both engines sample one distribution (every
# position together: each position's test at FALSE_ALARM / SAMPLED_STEPS).
FALSE_ALARM = 1e-4


def _sampled(model_dir: str, first_seed: int, engine_kwargs: dict) -> tuple[list[list[int]], dict]:
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    prompt = AutoTokenizer.from_pretrained(model_dir)(SAMPLED_PROMPT)["input_ids"]
    params = [SamplingParams(temperature=0.7, max_tokens=SAMPLED_STEPS, ignore_eos=True, seed=first_seed + i)
              for i in range(DRAWS)]
    kwargs = dict(dtype="float32", enable_prefix_caching=False, max_num_seqs=256, max_num_batched_tokens=2048,
                  disable_log_stats=False)
    with engine(model_dir, **kwargs, **engine_kwargs) as llm:
        outs = llm.generate([{"prompt_token_ids": prompt}] * DRAWS, params, use_tqdm=False)
        stats = _stats(llm)
    return [list(o.outputs[0].token_ids) for o in outs], stats


@pytest.mark.slow
def test_sampled_tokens_follow_the_target_distribution():
    """Seeded sampling: at each generated position, the tokens drawn with drafts verified by
    vLLM's rejection sampler (accepted drafts, recovered tokens, bonus tokens) follow the
    distribution of those drawn without a drafter."""
    from scripts import train_tiny_mtp as trainer

    folder = str(trainer.DEFAULT_OUT)
    without, _ = _sampled(folder, SEEDS_WITHOUT, {})
    with_mtp, stats = _sampled(folder, SEEDS_WITH, _mtp(3))
    print(f"\ntrained head, 3 speculative tokens, temperature 0.7: {stats['accepted']:.0f} of "
          f"{stats['drafts']:.0f} drafts accepted, per position {stats['per_position']}")
    assert stats["accepted"] > 0, "no draft was accepted: the rejection sampler's accept path was not tested"
    tested = 0
    for step in range(SAMPLED_STEPS):
        p, dof = chi2_homogeneity([d[step] for d in with_mtp], [d[step] for d in without])
        print(f"position {step}: chi-square p = {p:.3g} on {dof} dof")
        assert p > FALSE_ALARM / SAMPLED_STEPS, f"position {step}: chi-square p = {p:.2e} on {dof} dof"
        tested += dof > 0
    assert tested >= 2, "fewer than 2 positions had more than one token to compare"


@pytest.mark.slow
def test_bf16_ids_with_mtp_follow_transformers_to_the_first_near_tie(repeat_head):
    """bf16, drafts accepted: verify rows round like any bf16 implementation may, so the ids
    are held to transformers' bf16 ids under ``oracle``'s tie rule (as every bf16 e2e test)."""
    prompts = ALONE + TOGETHER[: len(LENGTHS)]  # one of each length
    kwargs = dict(dtype="bfloat16", enable_prefix_caching=False, max_num_seqs=32, disable_log_stats=False)
    with engine(repeat_head, **kwargs, **_mtp(3)) as llm:
        got = _greedy(llm, prompts)
        stats = _stats(llm)
    assert stats["accepted"] > 0, "no draft was accepted: the multi-token state advance was not tested"
    for prompt, ids in zip(prompts, got):
        want, want_logits = hf_greedy(repeat_head, torch.bfloat16, prompt, MAX_NEW_TOKENS)
        assert_greedy_matches(ids, want, want_logits, torch.bfloat16)


@pytest.mark.slow
@pytest.mark.skipif(not __import__("vllm_gdn_neuron.ops.backends.vllm_cpu", fromlist=["x"]).is_available(),
                    reason="vLLM's compiled CPU ops (vllm-cpu) not installed")
def test_bf16_verify_on_vllms_kernel_follows_transformers(tmp_path, monkeypatch):
    """The trained checkpoint with GDN heads of 64 (``scripts/scale_checkpoint.py``: the shapes
    vLLM's C++ kernels take), its own head drafting 3 tokens, every GDN phase on ``vllm_cpu``:
    verify rows run vLLM's speculative decode kernel; bf16 ids under the tie rule."""
    from scripts import scale_checkpoint as scale
    from scripts import train_tiny_mtp as trainer

    folder = scale.scale(trainer.DEFAULT_OUT, tmp_path / "wide", key_head_dim=64, value_head_dim=64)
    monkeypatch.setenv("VLLM_GDN_BACKEND", "vllm_cpu")
    from transformers import AutoTokenizer

    from vllm_gdn_neuron.ops.backends import vllm_cpu

    kernel_calls = []
    real = vllm_cpu.fused_verify_pages
    monkeypatch.setattr(vllm_cpu, "fused_verify_pages", lambda *args: kernel_calls.append(1) or real(*args))

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer(text)["input_ids"] for text in
               ("count from three to nine:", "the months from october to march:", "count down from twelve to six:")]
    kwargs = dict(dtype="bfloat16", enable_prefix_caching=False, max_num_seqs=8, disable_log_stats=False)
    with engine(str(folder), **kwargs, **_mtp(3)) as llm:
        got = _greedy(llm, prompts)
        stats = _stats(llm)
    assert stats["accepted"] > 0, "no draft was accepted: the multi-token state advance was not tested"
    assert kernel_calls, "no verify row ran on vLLM's kernel"
    for prompt, ids in zip(prompts, got):
        want, want_logits = hf_greedy(str(folder), torch.bfloat16, prompt, MAX_NEW_TOKENS)
        assert_greedy_matches(ids, want, want_logits, torch.bfloat16)


# --- every layout, and the head against transformers' modules --------------------------------------------------

def _checkpoint_tensors(model_dir: str) -> dict:
    from safetensors.torch import load_file

    folder = pathlib.Path(model_dir)
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    return tensors


def _text_config(model_dir: str):
    import transformers

    return transformers.AutoConfig.from_pretrained(model_dir).get_text_config()


def _reference_head(model_dir: str):
    """``f(input_ids [T], positions [T], hidden [T, H]) -> [T, H]``: the checkpoint's MTP head and
    embedding in transformers' modules, float32, causal attention over the T tokens."""
    import transformers as tf

    config = _text_config(model_dir)
    tensors = _checkpoint_tensors(model_dir)
    head = builder.mtp_head(config)
    state = {}
    for name, param in head.state_dict().items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix = "mtp." + name[: -len("gate_up_proj")]
            state[name] = torch.stack([torch.cat([tensors[f"{prefix}{e}.gate_proj.weight"],
                                                  tensors[f"{prefix}{e}.up_proj.weight"]]) for e in range(len(param))])
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = "mtp." + name[: -len("down_proj")]
            state[name] = torch.stack([tensors[f"{prefix}{e}.down_proj.weight"] for e in range(len(param))])
        else:
            state[name] = tensors[f"mtp.{name}"]
    head.load_state_dict({k: v.float() for k, v in state.items()})
    embed = next(v for k, v in tensors.items() if k.endswith("embed_tokens.weight")).float()
    modules = {"qwen3_5_text": tf.models.qwen3_5.modeling_qwen3_5.Qwen3_5TextRotaryEmbedding,
               "qwen3_5_moe_text": tf.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeTextRotaryEmbedding,
               "qwen3_next": tf.models.qwen3_next.modeling_qwen3_next.Qwen3NextRotaryEmbedding}
    rope_config = head["layers"][0].self_attn.config
    rope_config.rope_parameters = {k: v for k, v in rope_config.rope_parameters.items()
                                   if k not in ("mrope_section", "mrope_interleaved")}
    rotary = modules[config.model_type](rope_config)

    def forward(input_ids, positions, hidden):
        with torch.no_grad():
            x = torch.cat([head["pre_fc_norm_embedding"](embed[input_ids]), head["pre_fc_norm_hidden"](hidden)], -1)
            x = head["fc"](x)[None]
            position_ids = positions[None]
            out = head["layers"][0](x, position_embeddings=rotary(x, position_ids), attention_mask=None,
                                    position_ids=position_ids)
            out = out[0] if isinstance(out, tuple) else out
            return head["norm"](out)[0]

    return forward


_captured: list = []


def _capture_drafter(worker) -> str:
    """Run in the engine's worker: record the drafter's inputs and output of every call.

    The drafter declares compile support, whose ``__call__`` runs ``self.forward`` directly
    (no ``nn.Module`` hooks fire), so the instance's ``forward`` is wrapped instead.
    """
    model = worker.model_runner.drafter.model
    forward = model.forward

    def recording_forward(*args, **kwargs):
        output = forward(*args, **kwargs)
        _captured.append({k: kwargs[k].detach().clone() for k in ("input_ids", "positions", "hidden_states")}
                         | {"output": output.detach().clone()})
        return output

    model.forward = recording_forward
    return type(model).__module__ + "." + type(model).__name__


# qwen3_5-dense's layout is the one the tests above serve; qwen3-next's head layer (layer 0,
# decoder_sparse_step 2) and qwen3_5-vl's have its dense MLP.
LAYOUTS = [("qwen3_5-moe", 1), ("qwen3-next", 3), ("qwen3_5-vl", 2), ("qwen3_5-moe-vl", 2)]
LAYOUT_PROMPTS = 3


@pytest.mark.slow
@pytest.mark.parametrize("model, num_speculative_tokens", LAYOUTS)
def test_every_layout_loads_its_head_and_drafts_like_transformers(tiny_model, model, num_speculative_tokens):
    model_dir = tiny_model(model)
    prompt = [random.Random(5).randrange(3, 512) for _ in range(40)]
    kwargs = dict(dtype="float32", enable_prefix_caching=False, **_mtp(num_speculative_tokens))
    if model.endswith("-vl"):  # text-only serving: 1-D positions, which the head's reference takes
        kwargs["limit_mm_per_prompt"] = {"image": 0, "video": 0}
    _captured.clear()
    with engine(model_dir, **kwargs) as llm:
        drafter = llm.collective_rpc(_capture_drafter)[0]
        got = _greedy(llm, [prompt] + TOGETHER[:LAYOUT_PROMPTS])
        captured = list(_captured)
    assert drafter.startswith("vllm_gdn_neuron.shells.vllm.qwen3_5_mtp."), drafter
    # The first drafting call: the prompts' prefill, each attending within itself; the first
    # prompt's rows come first.
    call = captured[0]
    rows = slice(0, len(prompt))
    assert call["positions"][rows].tolist() == list(range(len(prompt)))
    assert call["input_ids"][: len(prompt) - 1].tolist() == prompt[1:]
    want = _reference_head(model_dir)(call["input_ids"][rows], call["positions"][rows], call["hidden_states"][rows])
    torch.testing.assert_close(call["output"][rows], want, rtol=1e-4, atol=1e-4)
    for p, ids in zip([prompt] + TOGETHER[:LAYOUT_PROMPTS], got):
        assert ids == hf_greedy(model_dir, torch.float32, p, MAX_NEW_TOKENS)[0], len(p)


@pytest.mark.slow
def test_a_checkpoint_without_an_mtp_head_is_refused(tiny_model, tmp_path):
    """The target's tensors only (as some conversions ship): the drafter says what is missing."""
    import shutil

    folder = tmp_path / "no-mtp"
    shutil.copytree(tiny_model("qwen3_5-dense"), folder)
    (folder / builder.MTP_SHARD).unlink()
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(Exception, match="the checkpoint has no MTP head \\(no mtp.fc.weight"):
        with engine(str(folder), dtype="float32", enable_prefix_caching=False, **_mtp(2)):
            pass


@pytest.mark.slow
def test_mtp_with_prefix_caching_is_refused(tiny_model):
    with pytest.raises(Exception, match="speculative decoding with prefix caching.*--no-enable-prefix-caching"):
        with engine(tiny_model("qwen3_5-dense"), dtype="float32", enable_prefix_caching=True, **_mtp(2)):
            pass
