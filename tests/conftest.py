"""Session-wide test settings shared by every test package."""

import os
import tempfile

# vLLM writes model-inspection caches and compile artefacts under VLLM_CACHE_ROOT; keep
# them out of the user's home and away from other runs.
os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="vllm-gdn-cache-"))
