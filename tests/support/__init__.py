"""What several test folders share: transformers' oracles (``oracle``, ``vision_oracle``, the
block-FP8 one ``fp8``), vLLM engines in this process or a child (``engines``) and served
``vllm-gdn-serve`` processes (``serving``). The tiny checkpoints come from the ``tiny_model``
fixture of tests/conftest.py."""
