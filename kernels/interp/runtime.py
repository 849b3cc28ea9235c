"""The state of the kernel launch being interpreted: program ids, memory, the cost recorder.

One launch runs at a time (the interpreter is single-threaded, like a NeuronCore's
instruction streams); every ``nl``/``nisa`` call looks the launch up here.
"""

import contextlib

from .memory import MemoryTracker


class Execution:
    """One ``@nki.jit`` launch.

    Attributes:
        grid: the SPMD grid, a tuple of ints (``()`` for a plain call).
        program_id: the running program's index in the grid, one int per grid axis.
        memory: live/peak SBUF and PSUM accounting (:class:`MemoryTracker`).
        recorder: the active cost recorder (:class:`..cost.Recorder`) or None.
        shared: ``nl.shared_hbm`` tensors by allocation order, shared by all programs.
    """

    __slots__ = ("grid", "program_id", "memory", "recorder", "shared", "shared_cursor", "loops")

    def __init__(self, grid: tuple, recorder):
        self.grid = grid
        self.program_id = (0,) * len(grid)
        self.memory = MemoryTracker()
        self.recorder = recorder
        self.shared = []
        self.shared_cursor = 0
        self.loops = []  # per open device loop, the index of its running iteration

    @property
    def in_program_body(self) -> bool:
        """True outside device loops or in the first iteration of each: what the program holds once."""
        return not any(self.loops) and self.program_id == (0,) * len(self.grid)

    def start_program(self, program_id: tuple) -> None:
        self.program_id = program_id
        self.shared_cursor = 0


_active = None


def current(op: str) -> Execution:
    """The running launch; ``op`` names the caller in the error raised outside a kernel."""
    if _active is None:
        raise RuntimeError(f"{op}: NKI calls are only valid inside a running @nki.jit kernel")
    return _active


def is_running() -> bool:
    return _active is not None


@contextlib.contextmanager
def running(execution: Execution):
    global _active
    if _active is not None:
        raise RuntimeError("a @nki.jit kernel is already running; call other kernels' bodies as plain functions")
    _active = execution
    try:
        yield execution
    finally:
        _active = None
