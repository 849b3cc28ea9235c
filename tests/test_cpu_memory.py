"""Which NUMA node vLLM's CPU worker checks, what it reads there, and the cache sized to fit (fake machines)."""

import pytest

from vllm_gdn_neuron import cli, cpu_memory
from vllm_gdn_neuron.preflight import CheckpointError
from vllm_gdn_neuron.units import GiB

from .cpu_memory_testing import FakeNode, fake_machine, two_nodes


def _workers(root, world_size=1, **env):
    return cpu_memory.worker_nodes(cpu_memory.read_topology(root, machine="x86_64"), world_size, env)


def test_one_node_reads_free_plus_file_pages_plus_reclaimable(tmp_path):
    node = FakeNode(tuple(range(4)), total=24, free=9.5, active_file=1.5, inactive_file=10.5, reclaimable=1.25)
    root = fake_machine(tmp_path, {0: node}, mem_available=22.0)
    [worker] = _workers(root)
    assert worker.node == 0
    assert worker.memory == cpu_memory.NodeMemory(total=24 * GiB, available=node.available)
    assert worker.cpus == (0, 1, 2)  # auto binding keeps the last CPU for vLLM's other processes


def test_smt_siblings_bind_the_highest_thread_of_each_core(tmp_path):
    root = two_nodes(tmp_path)
    [worker] = _workers(root)
    assert worker.cpus == (1, 3, 5)  # cores {0,1} {2,3} {4,5} {6,7}; the last core reserved


def test_one_worker_on_two_nodes_checks_node_zero_only(tmp_path):
    [worker] = _workers(two_nodes(tmp_path))
    assert (worker.node, worker.memory.total) == (0, 16 * GiB)


def test_two_workers_on_two_nodes_check_one_node_each(tmp_path):
    workers = _workers(two_nodes(tmp_path), world_size=2)
    assert [(w.rank, w.node, w.cpus) for w in workers] == [(0, 0, (1, 3, 5)), (1, 1, (9, 11, 13))]


def test_visible_memory_nodes_move_the_worker(tmp_path):
    [worker] = _workers(two_nodes(tmp_path), CPU_VISIBLE_MEMORY_NODES="1")
    assert (worker.node, worker.memory.total) == (1, 64 * GiB)


def test_a_process_confined_to_node_one_checks_node_one(tmp_path):
    root = two_nodes(tmp_path, allowed=list(range(8, 16)), memory_nodes=[1])
    assert _workers(root)[0].node == 1
    assert _workers(root, VLLM_CPU_OMP_THREADS_BIND="nobind")[0].node == 1


def test_an_explicit_binding_checks_the_node_of_its_first_cpu(tmp_path):
    root = two_nodes(tmp_path)
    assert [w.node for w in _workers(root, VLLM_CPU_OMP_THREADS_BIND="8-15")] == [1]
    assert [w.node for w in _workers(root, 2, VLLM_CPU_OMP_THREADS_BIND="0-3|4-7")] == [0, 0]
    assert _workers(root, VLLM_CPU_OMP_THREADS_BIND="nobind")[0].cpus == tuple(range(16))


def test_simulated_nodes_cut_the_cpus_into_runs(tmp_path):
    workers = _workers(fake_machine(tmp_path, {0: FakeNode(tuple(range(8)), total=32, free=20)}), 2,
                       VLLM_CPU_SIM_MULTI_NUMA="1")
    assert [w.cpus for w in workers] == [(0, 1, 2), (4, 5, 6)]


@pytest.mark.parametrize(("world_size", "env", "message"), [
    (2, {}, r"VLLM_CPU_OMP_THREADS_BIND=auto binds each of the 2 CPU workers to its own NUMA node, and this process "
            r"may allocate on nodes \[0\]"),
    (2, {"VLLM_CPU_OMP_THREADS_BIND": "0-3"}, r"must give one CPU list per worker \(2, separated by '\|'\); got 1"),
])
def test_bindings_vllm_refuses_are_refused(tmp_path, world_size, env, message):
    root = fake_machine(tmp_path, {0: FakeNode(tuple(range(8)), total=32, free=20)})
    with pytest.raises(cpu_memory.PlacementError, match=message):
        _workers(root, world_size, **env)


def test_a_cgroup_limit_below_the_node_caps_total_and_available(tmp_path):
    root = two_nodes(tmp_path, cgroup=(12.0, 11.0))
    [worker] = _workers(root)
    assert worker.memory == cpu_memory.NodeMemory(total=12 * GiB, available=1 * GiB)


def test_without_node_meminfo_the_machine_figures_count(tmp_path):
    root = fake_machine(tmp_path, {0: FakeNode((0, 1), total=8, free=1)}, mem_available=5.0, node_meminfo=False)
    assert _workers(root)[0].memory == cpu_memory.NodeMemory(total=8 * GiB, available=5 * GiB)


def test_id_lists_read_and_write_the_kernel_syntax():
    assert cpu_memory.parse_id_list("0-2,4,7-8\n") == [0, 1, 2, 4, 7, 8]
    assert cpu_memory.format_id_list([8, 0, 1, 2, 4, 7]) == "0-2,4,7-8"


# --- the cache vllm-gdn-serve derives on these machines -----------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Qwen3.5-2B's published dimensions (24 layers, 248,320 tokens): the CLI reads only
    ``config.json`` and looks for a ``*.safetensors`` name."""
    import json

    from vllm_gdn_neuron.preflight import load_checkpoint

    folder = tmp_path_factory.mktemp("cpu-memory") / "qwen3_5-2b"
    folder.mkdir()
    config = dict(
        architectures=["Qwen3_5ForCausalLM"], vocab_size=248_320, hidden_size=2048, intermediate_size=6144,
        num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        full_attention_interval=4, max_position_embeddings=262_144, tie_word_embeddings=True, dtype="bfloat16",
    )
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    return load_checkpoint(str(folder))


def _derive(checkpoint, root, given=None, machine_gib=100.0):
    given = given or {}
    return cli.derive_settings(checkpoint, given, (int(machine_gib * GiB), "MemAvailable"),
                               cli.worker_nodes(given, root))


def test_the_cache_fits_the_checked_node_not_the_machine(tmp_path, checkpoint):
    nodes = {0: FakeNode(tuple(range(8)), total=16, free=8), 1: FakeNode(tuple(range(8, 16)), total=64, free=60)}
    root = fake_machine(tmp_path, nodes, threads_per_core=2)
    settings = _derive(checkpoint, root, {"max-num-seqs": "256"})
    node_room = nodes[0].available - cli.RUNTIME_BYTES - settings.weights
    assert settings.cache <= cli.CACHE_SHARE * node_room < cli.CACHE_SHARE * (100 * GiB - settings.weights)
    assert settings.cache > cli.CACHE_SHARE * node_room - 2**20
    assert "checks NUMA node 0: 9.00 GiB free of 16.00 GiB" in settings.report(checkpoint)


def test_two_workers_each_fit_their_own_node(tmp_path, checkpoint):
    nodes = {0: FakeNode(tuple(range(8)), total=16, free=8), 1: FakeNode(tuple(range(8, 16)), total=64, free=60)}
    settings = _derive(checkpoint, fake_machine(tmp_path, nodes), {"tensor-parallel-size": "2", "max-num-seqs": "256"})
    room = nodes[0].available - cli.RUNTIME_BYTES - settings.weights / 2  # half the weights per worker
    assert cli.CACHE_SHARE * room - 2**20 < settings.cache <= cli.CACHE_SHARE * room


def test_a_node_too_small_stops_before_vllm_in_one_line(tmp_path, checkpoint):
    root = two_nodes(tmp_path)  # node 0: 3 GiB free of 16
    with pytest.raises(CheckpointError) as refusal:
        _derive(checkpoint, root)
    message = str(refusal.value)
    assert "\n" not in message
    assert message.startswith(f"MODEL {checkpoint.source!r}: needs about ")
    assert message.endswith("NUMA node 0, whose memory vLLM's CPU worker (rank 0 on CPUs 1,3,5) checks, "
                            "has 3.00 GiB free of 16.00 GiB")


def test_the_machine_limit_still_counts(tmp_path, checkpoint):
    root = fake_machine(tmp_path, {0: FakeNode(tuple(range(8)), total=64, free=60)})
    with pytest.raises(CheckpointError, match=r"; 5.00 GiB is available \(MemAvailable\)$"):
        _derive(checkpoint, root, machine_gib=5.0)


def test_a_given_cache_larger_than_the_node_is_refused(tmp_path, checkpoint, monkeypatch):
    root = two_nodes(tmp_path)
    with pytest.raises(CheckpointError, match=r"--kv-cache-memory-bytes \(8.00 GiB per worker\) and the weights .* "
                                              r"do not fit: NUMA node 0, .* has 3.00 GiB free of 16.00 GiB"):
        _derive(checkpoint, root, {"kv-cache-memory-bytes": "8G"})
    monkeypatch.setenv(cli.KVCACHE_SPACE_ENV, "8")
    with pytest.raises(CheckpointError, match=r"VLLM_CPU_KVCACHE_SPACE \(8.00 GiB per worker\)"):
        _derive(checkpoint, root)
    monkeypatch.setenv(cli.KVCACHE_SPACE_ENV, "1")
    monkeypatch.setenv("CPU_VISIBLE_MEMORY_NODES", "1")  # node 1: 61 GiB free
    settings = _derive(checkpoint, root)
    assert settings.cache is None and "--kv-cache-memory-bytes" not in settings.flags


def test_vllm_byte_counts_parse_as_vllm_parses_them():
    assert [cli.byte_count(v) for v in ("1073741824", "8G", "25.6k", "2M", "lots")] == [
        2**30, 8 * 2**30, 25_600, 2 * 2**20, None]


@pytest.fixture(scope="module")
def vl_checkpoint(tmp_path_factory, checkpoint):
    """The same text model as a vision-language checkpoint with Qwen3.5's published tower dims."""
    import json

    from vllm_gdn_neuron.preflight import load_checkpoint

    folder = tmp_path_factory.mktemp("cpu-memory-vl") / "qwen3_5-2b-vl"
    folder.mkdir()
    text = {k: v for k, v in vars(checkpoint.text).items() if k != "architectures"}
    vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, out_hidden_size=2048)  # the rest: defaults
    config = dict(architectures=["Qwen3_5ForConditionalGeneration"], text_config=text, vision_config=vision)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    return load_checkpoint(str(folder))


@pytest.mark.parametrize("given, counted", [
    ({}, True),
    ({"language-model-only": None}, False),
    ({"limit-mm-per-prompt": '{"image": 0, "video": 0}'}, False),
    ({"limit-mm-per-prompt": "{'image': 0, 'video': 0}"}, False),  # a YAML mapping, read back as text
    ({"limit-mm-per-prompt": '{"image": 0}'}, True),  # video keeps vLLM's limit
    ({"limit-mm-per-prompt": '{"image": {"count": 0}, "video": 0}'}, False),
    ({"limit-mm-per-prompt": "{not json"}, True),
])
def test_the_vision_tower_counts_where_vllm_builds_it(tmp_path, checkpoint, vl_checkpoint, given, counted):
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionConfig, Qwen3_5VisionModel

    with torch.device("meta"):  # transformers' own tower: the parameter count, independently
        tower = sum(p.numel() for p in Qwen3_5VisionModel(Qwen3_5VisionConfig(**vl_checkpoint.vision)).parameters())
    tower *= 2  # bf16
    root = fake_machine(tmp_path, {0: FakeNode(tuple(range(8)), total=64, free=60)})
    text_only = _derive(checkpoint, root, dict(given)).weights
    assert 851 * 2**20 < tower < 853 * 2**20  # 446.6 M parameters: docs/cpu-serving.md's 852 MiB for the 2B
    assert _derive(vl_checkpoint, root, dict(given)).weights == text_only + (tower if counted else 0)
