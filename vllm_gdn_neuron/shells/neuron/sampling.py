"""On-device sampling for vllm-neuron's runner: greedy, temperature, top-k and top-p in the step graph.

What the runner does (whn09/vllm-neuron @ ``7ea992789fa624ea6b0d7ad4cb0789e784863904``,
``vllm_neuron/vllm/worker/neuron_model_runner.py`` and ``vllm_neuron/model/neuron_config.py``):

- on-device sampling is on when ``neuron_config.on_device_sampling_config`` is not None
  (``NeuronConfig.from_dict``: a missing key means the default ``OnDeviceSamplingConfig()``,
  an explicit ``null`` turns it off); its fields are ``all_greedy``, ``max_top_k`` (256),
  ``deterministic``, ``sampling_dp_degree`` (1) and ``capture_topk``;
- every step passes ``sampling_params``: ``build_sampling_params_tensor`` stacks vLLM's
  ``SamplingMetadata`` into a float32 ``[num_reqs, 3]`` tensor of ``[top_k, top_p,
  temperature]`` (absent columns: top_k ``-1``, top_p ``1``, temperature ``0``; vLLM's
  ``InputBatch`` stores temperature 0 for a greedy request and top_k ``vocab_size`` for one
  without top-k), padded with zero rows to the step's block-table rows; warm-up passes
  ``[[0, 1, 1]] * rows``. No per-request seed reaches the model;
- the model returns ``(token_ids, logits_or_None)``; ``token_ids`` ``[rows]`` become the
  output (``tolist()``) and, under async scheduling, the next decode step's ``input_ids``
  (int32, the runner's id dtype). The logits are used only in synchronous mode, for
  logprobs, through vLLM's host ``Sampler``; the fork's own Qwen3.5 port returns them when
  ``neuron_config.max_logprobs != 0`` (the runner defaults that field to the engine's
  ``max_logprobs``);
- ``__init__`` refuses async scheduling unless on-device sampling is on.

The math follows vLLM's host sampler (``vllm/v1/sample/sampler.py``,
``ops/topk_topp_sampler.py``): a row with temperature below ``1e-5`` is greedy (the first
index of the largest logit); otherwise the logits are divided by the temperature, top-k
keeps every token at least as large as the k-th largest (ties kept), top-p keeps the most
likely tokens while the probability mass strictly before a token is below ``p`` (vLLM's
ascending ``cumsum <= 1 - p`` rule, the largest token always kept), probabilities are
normalised over what top-k kept (the whole vocabulary when top-k is off), and a token is
drawn from the kept ones in proportion to their probabilities.

How it runs on the device. As the runner's own sampler and NxDI's do (read in a sibling
fork of the runner, longdct/vllm-neuron ``vllm_neuron/functional/sampling.py``:
``torch.topk`` to ``max_top_k``, top-p through a matmul with a triangular matrix instead of
``cumsum``, one uniform draw per row compared against the CDF instead of
``torch.multinomial``), candidates are the ``max_top_k`` largest logits of the row
(``torch.topk``, one per row and step); cumulative sums over that window are matmuls with a
``[K, K]`` triangular matrix. So, stated: a sampled row draws only among its ``max_top_k``
most likely tokens. That is exact for top-k up to ``max_top_k`` and for a top-p nucleus that
fits in the window; a row with neither filter (or a larger top-k, or a wider nucleus) is
drawn from the window, renormalised. The greedy token is not taken from ``topk`` (whose
order among ties is not specified) but as the smallest index equal to the row maximum.

Random draws: one uniform per row from a counter-based integer hash of ``(seed, step,
row)`` (int32 xor / shift / multiply: "lowbias32", Chris Wellons), where ``step`` is a
one-element int32 counter the graph advances in place. It is the same on every
tensor-parallel rank (each rank samples the all-gathered logits and must feed the same id
back) and on CPU and device, and it needs no RNG state from the runtime. The seed is the
engine's ``--seed``; per-request ``SamplingParams.seed`` is not honoured because the runner
passes none. Uniforms have 24 bits: a token whose kept probability is below ``2**-24`` may
never be drawn. ``deterministic`` draws ``0.5`` for every row (the runner's sampler does).

Not verified on a device (guesses): that neuronx-cc compiles int32 multiply with
wrap-around, ``topk`` of ``max_top_k`` over the 248,320-token vocabulary and the in-place
counter (an input-output alias, as the caches are) within one NEFF per bucket.
"""

import math

import torch
from torch import nn

# vLLM's threshold below which a temperature means greedy (vllm/v1/sample/sampler.py).
SAMPLING_EPS = 1e-5
# OnDeviceSamplingConfig's default window.
DEFAULT_MAX_TOP_K = 256
# Columns of the runner's ``sampling_params`` rows.
TOP_K, TOP_P, TEMPERATURE = 0, 1, 2
NUM_COLUMNS = 3

_UNIFORM_BITS = 24
# lowbias32 constants, as signed int32.
_MIX_1 = 0x7FEB352D
_MIX_2 = 0x846CA68B - 2**32
_STEP_MUL = 0x9E3779B9 - 2**32
_ROW_MUL = 0x85EBCA6B - 2**32


def _as_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x >> bits`` by a tensor amount: torch-mlir lowers ``bitwise_right_shift.Tensor`` to a shift,
    and has no lowering of the scalar form (TorchNeuron decomposes it into a floor division)."""
    return torch.bitwise_right_shift(x, torch.full((), bits, dtype=x.dtype, device=x.device))


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int32 (logical shifts written as arithmetic shift + mask)."""
    x = x ^ (_shift_right(x, 16) & 0xFFFF)
    x = x * _MIX_1
    x = x ^ (_shift_right(x, 15) & 0x1FFFF)
    x = x * _MIX_2
    return x ^ (_shift_right(x, 16) & 0xFFFF)


def row_uniforms(seed: int, step: torch.Tensor, rows: int) -> torch.Tensor:
    """``[rows]`` float32 uniforms in ``[0, 1)``: a hash of ``(seed, step, row)``.

    Args:
        seed: any Python int (reduced to 32 bits).
        step: ``[1]`` int32, the step counter.
        rows: R.
    """
    row = torch.arange(rows, dtype=torch.int32, device=step.device)
    x = _mix(step * _STEP_MUL + _as_int32(seed))
    x = _mix(x + row * _ROW_MUL)
    return (_shift_right(x, 32 - _UNIFORM_BITS) & (2**_UNIFORM_BITS - 1)).to(torch.float32) * 2.0**-_UNIFORM_BITS


def check_sampling_params(sampling_params, rows: int) -> None:
    """Refuse a ``sampling_params`` of the wrong shape or dtype (static: checked while tracing).

    Raises:
        ValueError: naming ``sampling_params``, the expected ``[rows, 3]`` float32 and what was given.
    """
    if not isinstance(sampling_params, torch.Tensor):
        raise ValueError(f"sampling_params must be a [{rows}, {NUM_COLUMNS}] float32 tensor of [top_k, top_p, "
                         f"temperature] rows when on-device sampling is on; got {type(sampling_params).__name__}")
    if tuple(sampling_params.shape) != (rows, NUM_COLUMNS) or sampling_params.dtype != torch.float32:
        raise ValueError(f"sampling_params must be a [{rows}, {NUM_COLUMNS}] float32 tensor of [top_k, top_p, "
                         f"temperature] rows (one per logit row); got {list(sampling_params.shape)} "
                         f"{sampling_params.dtype}")


def check_sampling_values(sampling_params: torch.Tensor) -> None:
    """Refuse values vLLM's ``SamplingParams`` would refuse (host-side: reads the values).

    Per row: temperature finite and ``>= 0``; on a sampled row (temperature ``>= 1e-5``)
    top_p in ``(0, 1]`` and top_k an integer ``>= -1``. Greedy rows (the runner's zero
    padding rows among them) may carry any top_k / top_p.

    Raises:
        ValueError: naming the column, the rows and their values.
    """
    values = sampling_params.detach().to("cpu", torch.float64)
    top_k, top_p, temperature = values[:, TOP_K], values[:, TOP_P], values[:, TEMPERATURE]
    bad = (~torch.isfinite(temperature) | (temperature < 0)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"sampling_params temperature (column {TEMPERATURE}) must be finite and >= 0; "
                         f"rows {bad} have {temperature[bad].tolist()}")
    sampled = temperature >= SAMPLING_EPS
    bad = (sampled & ~((top_p > 0) & (top_p <= 1))).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"sampling_params top_p (column {TOP_P}) must be in (0, 1] on a sampled row; "
                         f"rows {bad} have {top_p[bad].tolist()}")
    bad = (sampled & ((top_k != top_k.round()) | (top_k < -1))).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"sampling_params top_k (column {TOP_K}) must be an integer >= -1 (-1, 0 or >= the "
                         f"vocabulary: off) on a sampled row; rows {bad} have {top_k[bad].tolist()}")


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``[R]`` int32: the first index of each row's largest value (``argmax`` without a two-value reduce)."""
    vocab = logits.shape[-1]
    index = torch.arange(vocab, dtype=torch.int32, device=logits.device)
    is_max = logits == logits.amax(dim=-1, keepdim=True)
    first = torch.where(is_max, index, torch.full_like(index, vocab)).amin(dim=-1)
    return first.clamp(max=vocab - 1)  # a row without a maximum (NaN) still names a valid id


def _select(values: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``values[r, position[r]]`` for ``[R, K]`` values and ``[R]`` positions, as a masked sum."""
    window = torch.arange(values.shape[-1], dtype=torch.int32, device=values.device)
    return torch.where(window == position[:, None], values, torch.zeros_like(values)).sum(dim=-1, dtype=values.dtype)


def sample_tokens(logits: torch.Tensor, sampling_params: torch.Tensor, uniforms: torch.Tensor,
                  max_top_k: int) -> torch.Tensor:
    """Sample one token per row, static shapes, no host reads.

    Dimensions:
        R: rows; V: vocabulary; K: ``min(max_top_k, V)``, the candidate window.

    Args:
        logits: ``[R, V]`` (any float dtype; computed in float32).
        sampling_params: ``[R, 3]`` float32 ``[top_k, top_p, temperature]`` rows.
        uniforms: ``[R]`` float32 in ``[0, 1)``.
        max_top_k: the window size.

    Returns:
        ``[R]`` int32 token ids.
    """
    logits = logits.to(torch.float32)
    rows, vocab = logits.shape
    window = min(max_top_k, vocab)
    top_k = sampling_params[:, TOP_K].round().to(torch.int32)
    top_p = sampling_params[:, TOP_P]
    temperature = sampling_params[:, TEMPERATURE]
    greedy = temperature < SAMPLING_EPS
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]

    values, indices = torch.topk(scaled, window, dim=-1)  # [R, K], descending
    top_k_on = (top_k > 0) & (top_k < vocab)
    kth = _select(values, top_k.clamp(1, window) - 1)
    in_top_k = (values >= kth[:, None]) | ~top_k_on[:, None]

    masked = torch.where(in_top_k, values, torch.full_like(values, -math.inf))
    log_norm = torch.where(top_k_on, torch.logsumexp(masked, dim=-1), torch.logsumexp(scaled, dim=-1))
    probs = torch.exp(masked - log_norm[:, None])  # [R, K], normalised over what top-k kept

    strictly_before = torch.triu(torch.ones(window, window, dtype=torch.float32, device=logits.device), diagonal=1)
    mass_before = probs @ strictly_before
    first = torch.arange(window, device=logits.device) == 0  # the largest token is always kept
    keep = (in_top_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0))) | first
    kept = torch.where(keep, probs, torch.zeros_like(probs))

    cdf = kept @ torch.triu(torch.ones(window, window, dtype=torch.float32, device=logits.device))
    target = uniforms * cdf[:, -1]
    last_kept = keep.sum(dim=-1, dtype=torch.int32) - 1
    choice = torch.minimum((cdf <= target[:, None]).sum(dim=-1, dtype=torch.int32), last_kept)
    drawn = _select(indices.to(torch.int32), choice)
    return torch.where(greedy, greedy_tokens(logits), drawn).to(torch.int32)


class OnDeviceSampler(nn.Module):
    """The sampler the Neuron shell runs after its logits when on-device sampling is on.

    Args:
        sampling_config: vllm-neuron's ``OnDeviceSamplingConfig`` (``all_greedy``,
            ``max_top_k``, ``deterministic``; checked by :func:`.checks.check_sampling_config`).
        seed: the engine's seed (the uniforms' key).
    """

    def __init__(self, sampling_config, seed: int = 0) -> None:
        super().__init__()
        self.all_greedy = bool(getattr(sampling_config, "all_greedy", False))
        self.max_top_k = int(getattr(sampling_config, "max_top_k", DEFAULT_MAX_TOP_K))
        self.deterministic = bool(getattr(sampling_config, "deterministic", False))
        self.seed = seed
        self.step: torch.Tensor | None = None

    def bind(self, device: torch.device) -> None:
        """Allocate the step counter on ``device`` (with the caches: after the weights, before warm-up)."""
        self.step = torch.zeros(1, dtype=torch.int32, device=device)

    def check(self, sampling_params, rows: int) -> None:
        """Refuse a bad ``sampling_params`` before the step does any work.

        Shape and dtype are checked always (while tracing, for a compiled step); values only
        where the call runs eagerly (a compiled step cannot read them without a host read).
        """
        check_sampling_params(sampling_params, rows)
        if self.step is None:
            raise RuntimeError("on-device sampling: bind_kv_cache has not run (the sampler's step counter "
                               "is allocated with the caches)")
        if not torch.compiler.is_compiling():
            check_sampling_values(sampling_params)

    def forward(self, logits: torch.Tensor, sampling_params: torch.Tensor) -> torch.Tensor:
        """``[R, V]`` logits and ``[R, 3]`` sampling params (checked by :meth:`check`) -> ``[R]`` int32
        token ids; advances the step counter."""
        rows = logits.shape[0]
        if self.all_greedy:
            return greedy_tokens(logits.to(torch.float32))
        if self.deterministic:
            uniforms = torch.full((rows,), 0.5, dtype=torch.float32, device=logits.device)
        else:
            uniforms = row_uniforms(self.seed, self.step, rows)
        self.step.add_(1)
        return sample_tokens(logits, sampling_params, uniforms, self.max_top_k)
