"""On-chip memory accounting: SBUF and PSUM capacity of one trn2 NeuronCore (NeuronCore-v3).

A tile occupies its per-partition footprint (``prod(shape[1:]) * itemsize`` bytes) on every
partition from the moment ``nl.ndarray`` allocates it until the tile object - the root
tensor and every view of it - is garbage-collected (CPython frees it as soon as the last
reference goes, e.g. when a loop variable is rebound or the kernel returns). Fragmentation
is not modelled for SBUF. A PSUM tile must fit one 2 KiB bank per partition; tiles are
placed first-fit into the 8 banks (several small tiles may share a bank).
"""

from .errors import NkiCapacityError, refuse

# Sources: docs/nki-rules.md, section "Memory".
PARTITIONS = 128  # nl.tile_size.pmax (NKI language API; Trainium2 Architecture Guide for NKI, SBUF/PSUM)
# NeuronCore-v3 SBUF is 28 MiB = 224 KiB per partition (NeuronCore-v3 architecture page, "On-chip SRAM";
# the Trainium3 guide: "up from 28 MiB in NeuronCore-v3"). Part of it is reserved
# (nl.tile_size.total_available_sbuf_size, "total minus reserved bytes", no number published):
# the interpreter assumes 192 KiB usable per partition. UNKNOWN: the real usable share.
SBUF_BYTES_PER_PARTITION = 192 * 1024
PSUM_BANKS = 8  # PSUM: 16 KiB per partition in 8 banks (Trainium2 Architecture Guide for NKI, PSUM)
PSUM_BANK_BYTES = 2 * 1024  # 512 fp32 per partition per bank (nl.tile_size.psum_fmax = 512)
PSUM_BYTES_PER_PARTITION = PSUM_BANKS * PSUM_BANK_BYTES  # 16 KiB x 128 = 2 MiB


def _kib(nbytes: int) -> str:
    return f"{nbytes / 1024:g} KiB"


class MemoryTracker:
    """Live and peak per-partition bytes of SBUF and PSUM for one kernel launch."""

    def __init__(self):
        self.sbuf_live = 0
        self.sbuf_peak = 0
        self.psum_bank_used = [0] * PSUM_BANKS
        self.psum_peak = 0

    @property
    def psum_live(self) -> int:
        return sum(self.psum_bank_used)

    def allocate_sbuf(self, nbytes: int, what: str) -> None:
        """Account ``nbytes`` per partition of SBUF for the tile described by ``what``."""
        live = self.sbuf_live + nbytes
        if live > SBUF_BYTES_PER_PARTITION:
            raise NkiCapacityError(
                f"nl.ndarray: SBUF over capacity allocating {what} ({_kib(nbytes)} per partition): "
                f"live SBUF would be {_kib(live)} per partition, limit {_kib(SBUF_BYTES_PER_PARTITION)} "
                f"per partition (24 MiB usable of 28 MiB); peak so far {_kib(self.sbuf_peak)} per partition"
            )
        self.sbuf_live = live
        self.sbuf_peak = max(self.sbuf_peak, live)

    def release_sbuf(self, nbytes: int) -> None:
        self.sbuf_live -= nbytes

    def allocate_psum(self, nbytes: int, what: str) -> int:
        """Place a PSUM tile of ``nbytes`` per partition into a bank; returns the bank index."""
        if nbytes > PSUM_BANK_BYTES:
            raise refuse(
                "nl.ndarray", f"PSUM tile {what}",
                f"needs {nbytes} bytes per partition; a PSUM tile must fit one "
                f"{PSUM_BANK_BYTES}-byte bank (512 fp32) per partition",
            )
        for bank, used in enumerate(self.psum_bank_used):
            if used + nbytes <= PSUM_BANK_BYTES:
                self.psum_bank_used[bank] = used + nbytes
                self.psum_peak = max(self.psum_peak, self.psum_live)
                return bank
        raise NkiCapacityError(
            f"nl.ndarray: PSUM over capacity allocating {what} ({nbytes} bytes per partition): "
            f"all {PSUM_BANKS} banks of {PSUM_BANK_BYTES} bytes are occupied "
            f"(live {_kib(self.psum_live)} per partition of {_kib(PSUM_BYTES_PER_PARTITION)}, 2 MiB in all); "
            f"peak so far {_kib(self.psum_peak)} per partition"
        )

    def release_psum(self, nbytes: int, bank: int) -> None:
        self.psum_bank_used[bank] -= nbytes
