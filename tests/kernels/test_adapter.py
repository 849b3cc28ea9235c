"""The engine-facing adapter: page-major caches updated in place through slot tensors, against
the float64 references; one compiled kernel per shape bucket; kernels launched only by NkiOp."""

import ast
import pathlib

import pytest
import torch

from vllm_gdn_neuron.kernels import adapter, nki_call
from vllm_gdn_neuron.kernels.gdn2 import launch as gdn2_launch
from vllm_gdn_neuron.kernels.reference import causal_conv1d, causal_conv1d_step, gdn2_recurrence, gdn_recurrence

from .kernel_testing import assert_close, gdn_inputs, random_state, reference_cte

SCALE = 16**-0.5
ROOT = pathlib.Path(__file__).resolve().parents[2]


class _Recorder:
    """Records the compile-time (non-tensor) arguments of every kernel launch of the adapter."""

    def __init__(self, monkeypatch):
        self.launches = []
        original = nki_call.NkiOp.__call__

        def call(op, *args, **kwargs):
            constants = tuple((k, v) for k, v in sorted(kwargs.items()) if not isinstance(v, torch.Tensor))
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            self.launches.append((op.name, shapes, constants))
            return original(op, *args, **kwargs)

        monkeypatch.setattr(nki_call.NkiOp, "__call__", call)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gdn_prefill_reads_and_writes_cache_rows_by_slot(dtype):
    query, key, value, g_log, beta = gdn_inputs(2, 1, 2, 128, 16, 16, dtype, seed=3)
    cache = random_state(5, 2, 16, 16)
    before = cache.clone()
    slots = torch.tensor([4, 1])
    out = adapter.gdn_prefill(query, key, value, g_log, beta, cache, slots, SCALE)
    ref_out, ref_state = reference_cte(query, key, value, g_log, beta, SCALE, initial_state=before[[4, 1]])
    assert_close(out, ref_out, dtype, "out")
    assert_close(cache[[4, 1]], ref_state, dtype, "cache rows")
    assert torch.equal(cache[[0, 2, 3]], before[[0, 2, 3]])


def test_gdn_prefill_without_initial_state_ignores_the_cache_contents():
    query, key, value, g_log, beta = gdn_inputs(1, 1, 1, 128, 16, 16, torch.float32, seed=4)
    cache = torch.full((3, 1, 16, 16), float("nan"))
    out = adapter.gdn_prefill(query, key, value, g_log, beta, cache, torch.tensor([2]), SCALE, initial_state=False)
    ref_out, ref_state = reference_cte(query, key, value, g_log, beta, SCALE)
    assert_close(out, ref_out, torch.float32, "out")
    assert_close(cache[2:], ref_state, torch.float32, "state")


def test_gdn_decode_updates_the_slots_in_place():
    gen = torch.Generator().manual_seed(5)
    q = torch.nn.functional.normalize(torch.randn(3, 1, 16, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(3, 1, 16, generator=gen), dim=-1)
    v = torch.randn(3, 2, 16, generator=gen)
    g, beta = -torch.rand(3, 2, generator=gen), torch.rand(3, 2, generator=gen)
    cache = random_state(6, 2, 16, 16)
    before = cache.clone()
    slots = torch.tensor([5, 0, 2], dtype=torch.int32)
    out = adapter.gdn_decode(q, k, v, g, beta, cache, slots, SCALE)
    ref_o, ref_state = gdn_recurrence(q, k, v, g, beta, cu_seqlens=[0, 1, 2, 3], initial_state=before[[5, 0, 2]],
                                      scale=SCALE)
    assert_close(out, ref_o, torch.float32, "o")
    assert_close(cache[[5, 0, 2]], ref_state, torch.float32, "slots")
    assert torch.equal(cache[[1, 3, 4]], before[[1, 3, 4]])


def test_conv1d_prefill_takes_lengths_and_slots_as_tensors():
    gen = torch.Generator().manual_seed(7)
    lengths = [5, 2, 9]
    x = torch.randn(3, 40, 9, generator=gen)
    weight = torch.randn(40, 4, generator=gen)
    cache = torch.randn(4, 40, 4, generator=gen)
    before = cache.clone()
    slots = torch.tensor([3, 0, 1])
    y = adapter.conv1d_prefill(x, weight, cache, slots, torch.tensor(lengths), activation="silu")
    for b, (slot, n) in enumerate(zip(slots.tolist(), lengths)):
        ref_y, ref_state = causal_conv1d(x[b, :, :n].T, weight, initial_state=before[slot:slot + 1])
        assert_close(y[b, :, :n].T, ref_y, torch.float32, f"y {b}")
        assert_close(cache[slot], ref_state[0], torch.float32, f"state {b}")
    assert torch.equal(cache[2], before[2])


def test_conv1d_decode_shifts_the_cache_rows_in_place():
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 40, generator=gen)
    weight = torch.randn(40, 4, generator=gen)
    cache = torch.randn(3, 40, 4, generator=gen)
    before = cache.clone()
    y = adapter.conv1d_decode(x, weight, cache, torch.tensor([2, 0]))
    ref_y, ref_state = causal_conv1d_step(x, weight, before[[2, 0]])
    assert_close(y, ref_y, torch.float32, "y")
    assert_close(cache[[2, 0]], ref_state, torch.float32, "cache")
    assert torch.equal(cache[1], before[1])


def test_gdn2_bucket_reads_and_writes_cache_rows_by_slot():
    gen = torch.Generator().manual_seed(10)
    lengths, s_len = [70, 5], 72
    q = torch.zeros(2, s_len, 1, 16)
    k, v = torch.zeros(2, s_len, 1, 16), torch.zeros(2, s_len, 2, 8)
    g, beta = torch.zeros(2, s_len, 2, 16), torch.zeros(2, s_len, 2, 16)
    for b, n in enumerate(lengths):  # real tokens first, zero padding after (exact)
        q[b, :n] = torch.nn.functional.normalize(torch.randn(n, 1, 16, generator=gen), dim=-1)
        k[b, :n] = torch.nn.functional.normalize(torch.randn(n, 1, 16, generator=gen), dim=-1)
        v[b, :n] = torch.randn(n, 2, 8, generator=gen)
        g[b, :n] = -torch.rand(n, 2, 16, generator=gen) * 5
        beta[b, :n] = torch.rand(n, 2, 16, generator=gen)
    cache = torch.randn(3, 2, 16, 8, generator=gen)
    before = cache.clone()
    slots = torch.tensor([2, 0])
    o = gdn2_launch.gdn2_prefill_bucket(q, k, v, g, beta, None, cache, slots, SCALE)
    for b, (slot, n) in enumerate(zip(slots.tolist(), lengths)):
        ref_o, ref_state = gdn2_recurrence(q[b, :n], k[b, :n], v[b, :n], g[b, :n], beta[b, :n],
                                           initial_state=before[slot:slot + 1], scale=SCALE)
        assert_close(o[b, :n], ref_o, torch.float32, f"o {b}")
        assert_close(cache[slot], ref_state[0], torch.float32, f"state {b}")
    assert torch.equal(cache[1], before[1])


def test_one_kernel_serves_every_slot_assignment_and_length_mix(monkeypatch):
    recorder = _Recorder(monkeypatch)
    gen = torch.Generator().manual_seed(9)
    x, weight = torch.randn(2, 40, 8, generator=gen), torch.randn(40, 4, generator=gen)
    cache = torch.zeros(6, 40, 4)
    for slots, lengths in (([0, 1], [8, 8]), ([5, 2], [3, 7])):
        adapter.conv1d_prefill(x, weight, cache, torch.tensor(slots), torch.tensor(lengths))
        adapter.conv1d_decode(x[..., 0], weight, cache, torch.tensor(slots))
    q = torch.nn.functional.normalize(torch.randn(2, 8, 1, 16, generator=gen), dim=-1)
    gates = -torch.rand(2, 8, 1, 16, generator=gen)
    ssm_cache = torch.zeros(6, 1, 16, 16)
    for slots in ([0, 1], [5, 3]):
        gdn2_launch.gdn2_prefill_bucket(q, q, torch.randn(2, 8, 1, 16, generator=gen), gates, -gates, None, ssm_cache,
                                    torch.tensor(slots), SCALE)
    for name in ("conv1d_prefill", "conv1d_decode", "gdn2_chunked"):
        launches = {launch for launch in recorder.launches if launch[0] == name}
        assert len(launches) == 1, name  # same shapes, same compile-time constants


def test_python_slot_lists_are_refused_by_the_op():
    from vllm_gdn_neuron.kernels.recurrent_step import RECURRENT_STEP

    q = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="argument state_indices is a Python sequence .* pass it as an int32 tensor"):
        RECURRENT_STEP(q, q, q, torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1, 16, 16), [0])


def test_kernels_are_launched_only_by_their_nki_op():
    """No module calls an ``@nki.jit`` kernel itself: every launch goes through an NkiOp."""
    kernels = {"conv1d_decode_kernel", "conv1d_prefill_kernel", "gdn2_kernel", "gdn_cte_kernel",
               "recurrent_step_kernel"}
    offenders = []
    for path in list((ROOT / "kernels").rglob("*.py")) + list((ROOT / "vllm_gdn_neuron").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func.value if isinstance(node.func, ast.Subscript) else node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in kernels:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
