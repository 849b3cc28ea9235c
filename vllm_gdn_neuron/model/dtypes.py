"""The dtype names a config or an engine setting may hold, and the model dtype of a config."""

import torch

#: Dtype names (``--dtype``, ``--mamba-cache-dtype``, a config's ``dtype``) -> torch dtypes.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def config_dtype(text_config, default: torch.dtype = torch.bfloat16) -> torch.dtype:
    """The config's ``dtype`` (or older ``torch_dtype``), a torch dtype or its name; ``default`` when unset.

    Raises:
        ValueError: naming the field, for a dtype name outside :data:`DTYPES`.
    """
    raw = getattr(text_config, "dtype", None) or getattr(text_config, "torch_dtype", None) or default
    if isinstance(raw, torch.dtype):
        return raw
    name = str(raw).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"config dtype must be one of {sorted(DTYPES)}; got {raw!r}")
    return DTYPES[name]
