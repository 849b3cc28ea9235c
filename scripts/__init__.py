"""The project's programs: serving, testing and environment set-up (shell), and the Python ones
that build the tiny and real-dims checkpoints (``build_tiny_models``), train and scale the
trained tiny model (``train_tiny_mtp``, ``scale_checkpoint``) and define its reference MTP head
(``mtp_reference``). Tests and benchmarks import the Python ones as ``scripts.<name>``."""
