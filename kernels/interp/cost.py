"""Trace and trn2 cost model: what a recorded kernel call would take on one NeuronCore-v3.

Usage::

    from vllm_gdn_neuron.kernels.interp import cost
    with cost.record() as recording:
        out = kernel(x, y)            # any number of @nki.jit launches
    report = recording.report()       # CostReport
    print(report.table())             # every figure labelled "modeled"
    report.modeled_time_s, report.engine_busy_share["tensor"], report.tensor_utilisation

Model. Each instruction is charged an engine occupancy from :class:`Trn2Spec`:

* TensorE (``nc_matmul``, ``nc_transpose``): one moving column per cycle,
  ``max(N, matmul_min_columns)`` cycles, four passes for fp32 operands, at the clock
  that makes a 128 x 128 array deliver ``tensor_bf16_flops``.
* VectorE / ScalarE / GpSimd: ``max(MIN_II, elements per partition / elements per partition
  per cycle)`` engine cycles, the ISA docs' cost form; VectorE runs 2-byte operands at twice
  the rate of 4-byte ones (a tile using fewer than 128 partitions leaves lanes idle).
* DMA: ``sum over descriptors of max(descriptor bytes, dma_min_descriptor_bytes)`` at the
  per-core HBM share, plus a fixed completion latency (pipelined: it delays dependants, not
  other transfers).

Compute engines are in-order queues running in parallel; an instruction starts when its
engine is free and every earlier instruction it depends on (read-after-write,
write-after-read, write-after-write on overlapping element ranges of the same tensor) has
completed. DMA transfers share the core's HBM bandwidth but are not in order (trn2 spreads
them over 16 DMA queues per core): a transfer fills the gaps of the bandwidth timeline
after its dependencies complete (split across gaps if needed, as concurrent queues share
bandwidth). The modeled time is the completion of the last
instruction. A model, not a measurement.
"""

import bisect
import contextlib
import dataclasses

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
PARTITIONS = 128


@dataclasses.dataclass(frozen=True)
class Trn2Spec:
    """Cost-model constants for one trn2 NeuronCore (NeuronCore-v3), each with its source.

    "ISA docs" = the NKI ``nki.isa`` API pages (SDK 2.32 / 2.33), "arch guide" = the
    Trainium2 Architecture Guide for NKI, "NC-v3 page" = the NeuronCore-v3 architecture page.
    """

    # TensorE: 79 dense BF16/FP16/TF32 TFLOPS (NC-v3 page, "Tensor Engine"); one moving column
    # per cycle of a 128 x 128 array, so the model's clock is 79e12 / (2 * 128 * 128) = 2.41 GHz.
    tensor_bf16_flops: float = 79e12
    tensor_rows: int = 128
    tensor_cols: int = 128
    # fp32 operands: ~1/4 of the bf16 rate (Trainium2 chip figures: 181 FP32 vs 667 BF16 dense
    # TFLOPS per chip, Trn2 architecture page), modeled as 4 passes of the array.
    fp32_passes: int = 4
    # the ISA docs' instruction cost is max(MIN_II, N) engine cycles, MIN_II ~64 cycles ("Estimated
    # instruction cost" of the nisa compute instructions); applied to TensorE's moving columns too.
    matmul_min_columns: int = 64
    # an fp32 stationary of 0.0 / 1.0 declared with is_stationary_onezero: "could lead to 2x better
    # performance" (ISA docs, nc_matmul, is_stationary_onezero): 2 passes instead of 4.
    onezero_speedup: int = 2
    # VectorE: 0.96 GHz, 512 elements per cycle for 2-byte (bf16/fp16) operands, 256 otherwise
    # (arch guide, "Compute Engine Specifications": 4 / 2 elements per partition per cycle).
    vector_clock_hz: float = 0.96e9
    vector_elements_per_cycle_16bit: int = 512
    vector_elements_per_cycle: int = 256
    # ScalarE: 1.2 GHz, 128 elements per cycle (one per partition; arch guide, same table).
    scalar_clock_hz: float = 1.2e9
    scalar_elements_per_cycle: int = 128
    # GpSimd: 8 cores of 512-bit SIMD at 1.2 GHz (arch guide, same table): 8 x 16 fp32 lanes,
    # 128 elements per cycle; its fixed cost: ~150 cycles (ISA docs, affine_select / iota).
    gpsimd_clock_hz: float = 1.2e9
    gpsimd_elements_per_cycle: int = 128
    gpsimd_min_cycles: int = 150
    # MIN_II of VectorE / ScalarE instructions: ~64 engine cycles (ISA docs, "Estimated instruction cost").
    min_ii_cycles: int = 64
    # HBM: 2.9 TB/s per Trainium2 chip (Trn2 architecture page; the arch guide rounds it to 3 TB/s)
    # shared by its 8 NeuronCores: the per-core share.
    hbm_bytes_per_s: float = 2.9e12 / 8
    # DMA fixed cost: ~2 us from issue to completion per transfer. ASSUMPTION: the NKI
    # performance guides describe a fixed DMA cost of this order without a number for trn2.
    dma_latency_s: float = 2e-6
    # the NKI DMA guides advise at least 512 B per partition per transfer: each contiguous run is
    # a descriptor charged at least 512 B of bandwidth. ASSUMPTION on how efficiency falls below it.
    dma_min_descriptor_bytes: int = 512

    @property
    def tensor_clock_hz(self) -> float:
        return self.tensor_bf16_flops / (2 * self.tensor_rows * self.tensor_cols)

    def occupancy(self, engine: str, work: dict) -> tuple:
        """``(busy seconds on the engine, extra completion latency)`` of one instruction.

        Compute engines: ``max(minimum cycles, elements per partition / elements per partition
        per cycle)`` engine cycles, the ISA docs' cost form (a tile on fewer than 128 partitions
        leaves lanes idle).
        """
        if engine == "tensor":
            passes = self.fp32_passes if work["fp32"] else 1
            if work.get("onezero"):
                passes = max(1, passes // self.onezero_speedup)
            return max(work["columns"], self.matmul_min_columns) * passes / self.tensor_clock_hz, 0.0
        if engine == "dma":
            moved = work["descriptors"] * max(work["run_bytes"], self.dma_min_descriptor_bytes)
            return moved / self.hbm_bytes_per_s, self.dma_latency_s
        per_partition = work["elements"] / work["partitions"]
        if engine == "gpsimd":
            clock, per_cycle, minimum = self.gpsimd_clock_hz, self.gpsimd_elements_per_cycle, self.gpsimd_min_cycles
        elif engine == "scalar":
            clock, per_cycle, minimum = self.scalar_clock_hz, self.scalar_elements_per_cycle, self.min_ii_cycles
        else:
            clock, minimum = self.vector_clock_hz, self.min_ii_cycles
            per_cycle = self.vector_elements_per_cycle_16bit if work.get("narrow") else self.vector_elements_per_cycle
        cycles = max(minimum, per_partition * PARTITIONS / per_cycle)
        return cycles / clock, 0.0


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One recorded instruction (times in modeled seconds from the recording's start)."""

    index: int
    engine: str
    op: str
    program_id: tuple
    dst_shape: tuple
    dst_dtype: str
    input_shapes: tuple
    macs: int
    elements: int
    bytes_moved: int
    hbm_bytes: int
    start_s: float
    end_s: float
    done_s: float


class _Regions:
    """Per tensor, the element ranges recently read or written and when that completes."""

    __slots__ = ("entries",)

    def __init__(self):
        self.entries = {}  # uid -> list of [lo, hi, done]

    def ready(self, uid, lo, hi) -> float:
        latest = 0.0
        for elo, ehi, done in self.entries.get(uid, ()):
            if elo <= hi and lo <= ehi and done > latest:
                latest = done
        return latest

    def add(self, uid, lo, hi, done) -> None:
        kept = [e for e in self.entries.get(uid, ()) if not (lo <= e[0] and e[1] <= hi and e[2] <= done)]
        kept.append((lo, hi, done))
        self.entries[uid] = kept

    def drop_covered(self, uid, lo, hi, done) -> None:
        entries = self.entries.get(uid)
        if entries:
            self.entries[uid] = [e for e in entries if not (lo <= e[0] and e[1] <= hi and e[2] <= done)]


class _Timeline:
    """Busy intervals of the shared DMA bandwidth.

    A transfer fills the gaps after its ready time, split across them if need be (transfers
    on different DMA queues share the bandwidth), so it spans ``start .. end`` with exactly
    ``length`` seconds of bandwidth inside.
    """

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts = []
        self.ends = []

    def place(self, ready: float, length: float) -> tuple:
        """Reserve ``length`` seconds of bandwidth from ``ready`` on; returns ``(start, end)``."""
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(ends, ready)
        t, left, first = ready, length, None
        pieces = []
        while left > 0:
            gap_end = starts[i] if i < len(starts) else float("inf")
            if t < gap_end:
                take = min(left, gap_end - t)
                pieces.append((t, t + take))
                first = t if first is None else first
                left -= take
                t += take
            if left > 0:
                t = max(t, ends[i])
                i += 1
        for lo, hi in pieces:
            self._insert(lo, hi)
        return first if first is not None else ready, t

    def _insert(self, lo: float, hi: float) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(starts, lo)
        if i > 0 and ends[i - 1] >= lo:  # touches the previous interval: extend it
            i -= 1
            ends[i] = max(ends[i], hi)
        else:
            starts.insert(i, lo)
            ends.insert(i, hi)
        while i + 1 < len(starts) and starts[i + 1] <= ends[i]:  # swallow the ones it now reaches
            ends[i] = max(ends[i], ends.pop(i + 1))
            starts.pop(i + 1)


class Recorder:
    """Collects and schedules the instructions of every launch inside ``cost.record()``."""

    def __init__(self, spec: Trn2Spec, keep_instructions: bool = True):
        self.spec = spec
        self.keep_instructions = keep_instructions
        self.instructions = []
        self.count = 0
        self.static_count = 0
        self.engine_free = dict.fromkeys(ENGINES, 0.0)
        self.busy = dict.fromkeys(ENGINES, 0.0)
        self.per_op = {}
        self.macs = 0
        self.hbm_bytes = 0
        self.dma_bytes = 0
        self.end = 0.0
        self.launches = []
        self._reads = _Regions()
        self._writes = _Regions()
        self._dma = _Timeline()

    def add(self, engine, op, dst, inputs, program_id, work, static=True) -> None:
        """Schedule one instruction writing ``dst`` and reading ``inputs``.

        ``static``: the instruction belongs to the program text (issued outside device loops or
        in their first iteration, in the first program of a grid), not a repeat of it.
        """
        self.static_count += static
        occupancy, latency = self.spec.occupancy(engine, work)
        reads = [t.extent() for t in inputs]
        write = dst.extent()
        ready = self._writes.ready(*write)
        for uid, lo, hi in reads:
            ready = max(ready, self._writes.ready(uid, lo, hi))
        ready = max(ready, self._reads.ready(*write))
        if engine == "dma":
            start, end = self._dma.place(ready, occupancy)
        else:
            start = max(ready, self.engine_free[engine])
            end = start + occupancy
            self.engine_free[engine] = end
        done = end + latency
        self.busy[engine] += occupancy
        for uid, lo, hi in reads:
            self._reads.add(uid, lo, hi, done)
        self._reads.drop_covered(*write, done)
        self._writes.add(*write, done)
        self.end = max(self.end, done)
        macs = work.get("macs", 0)
        self.macs += macs
        self.hbm_bytes += work.get("hbm_bytes", 0)
        self.dma_bytes += work.get("bytes", 0)
        stats = self.per_op.setdefault(op, [0, 0.0])
        stats[0] += 1
        stats[1] += occupancy
        if self.keep_instructions:
            self.instructions.append(Instruction(
                self.count, engine, op, program_id, dst.shape, dst.dtype.name,
                tuple(t.shape for t in inputs), macs, work.get("elements", 0), work.get("bytes", 0),
                work.get("hbm_bytes", 0), start, end, done,
            ))
        self.count += 1

    def finish_launch(self, kernel_name, grid, memory) -> None:
        self.launches.append(dict(kernel=kernel_name, grid=grid, sbuf_peak_bytes=memory.sbuf_peak,
                                  psum_peak_bytes=memory.psum_peak))

    def report(self) -> "CostReport":
        total = self.end
        spec = self.spec
        peak_macs = spec.tensor_rows * spec.tensor_cols * spec.tensor_clock_hz
        return CostReport(
            modeled_time_s=total,
            engine_busy_s=dict(self.busy),
            engine_busy_share={e: (b / total if total else 0.0) for e, b in self.busy.items()},
            tensor_utilisation=(self.macs / (peak_macs * total) if total else 0.0),
            tensor_roofline_s=self.macs / peak_macs,
            hbm_roofline_s=self.hbm_bytes / spec.hbm_bytes_per_s,
            macs=self.macs,
            hbm_bytes=self.hbm_bytes,
            dma_bytes=self.dma_bytes,
            instructions=self.count,
            static_instructions=self.static_count,
            per_op={op: (n, t) for op, (n, t) in self.per_op.items()},
            sbuf_peak_bytes=max((launch["sbuf_peak_bytes"] for launch in self.launches), default=0),
            psum_peak_bytes=max((launch["psum_peak_bytes"] for launch in self.launches), default=0),
            launches=len(self.launches),
        )


@dataclasses.dataclass(frozen=True)
class CostReport:
    """Modeled trn2 figures of a recording.

    Attributes:
        modeled_time_s: completion of the last instruction (modeled seconds).
        engine_busy_s / engine_busy_share: per engine, busy seconds and busy / modeled time.
        tensor_utilisation: MACs done / (128 x 128 MACs per TensorE cycle x modeled time),
            against the bf16 peak (fp32 matmuls can reach at most 1/4).
        tensor_roofline_s, hbm_roofline_s: the time the MACs alone at bf16 peak, and the HBM
            bytes alone at the per-core share, would take; ``roofline_s`` is their max.
        instructions: instructions executed; static_instructions: the program's size (device
            loops and grid programs counted once), what the compiler has to schedule.
        per_op: op name -> (instruction count, engine busy seconds).
        sbuf_peak_bytes, psum_peak_bytes: peak live bytes per partition over the launches.
    """

    modeled_time_s: float
    engine_busy_s: dict
    engine_busy_share: dict
    tensor_utilisation: float
    tensor_roofline_s: float
    hbm_roofline_s: float
    macs: int
    hbm_bytes: int
    dma_bytes: int
    instructions: int
    static_instructions: int
    per_op: dict
    sbuf_peak_bytes: int
    psum_peak_bytes: int
    launches: int

    @property
    def roofline_s(self) -> float:
        return max(self.tensor_roofline_s, self.hbm_roofline_s)

    def table(self) -> str:
        """A plain-text summary; every figure is labelled modeled."""
        us = 1e6
        lines = [
            f"modeled trn2 time           {self.modeled_time_s * us:12.2f} us  ({self.instructions} instructions "
            f"executed, {self.static_instructions} in the program, {self.launches} launch(es))",
            f"modeled roofline            {self.roofline_s * us:12.2f} us  (TensorE {self.tensor_roofline_s * us:.2f} us, "
            f"HBM {self.hbm_roofline_s * us:.2f} us)",
            f"modeled TensorE utilisation {self.tensor_utilisation * 100:11.1f} %   of bf16 peak",
            f"modeled HBM traffic         {self.hbm_bytes / 1e6:12.3f} MB",
        ]
        for engine in ENGINES:
            lines.append(f"modeled {engine:<7} busy        {self.engine_busy_s[engine] * us:12.2f} us  "
                         f"({self.engine_busy_share[engine] * 100:5.1f} % of modeled time)")
        for op, (count, busy) in sorted(self.per_op.items(), key=lambda item: -item[1][1]):
            lines.append(f"modeled {op:<20} {count:7d} x  {busy * us:12.2f} us busy")
        lines.append(f"modeled peak SBUF {self.sbuf_peak_bytes / 1024:.1f} KiB / partition, "
                     f"peak PSUM {self.psum_peak_bytes / 1024:.1f} KiB / partition")
        return "\n".join(lines)


_active = None


def active_recorder():
    """The recorder of the innermost ``cost.record()`` block, or None."""
    return _active


@contextlib.contextmanager
def record(spec: Trn2Spec = None, keep_instructions: bool = True):
    """Record and model every kernel launch in the block; yields the :class:`Recorder`.

    Args:
        spec: cost constants (default :class:`Trn2Spec`).
        keep_instructions: keep the per-instruction list in ``recorder.instructions``
            (turn off for very long traces; totals are kept either way).
    """
    global _active
    previous = _active
    recorder = Recorder(spec or Trn2Spec(), keep_instructions)
    _active = recorder
    try:
        yield recorder
    finally:
        _active = previous
