"""How close a re-executed hop must come to the signed one: the tolerances by name, without
torch, so that the command line can offer them without loading it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Tolerance:
    """How far a re-executed output may be from the signed one and still be honest work."""

    max_relative_error: float  # ||claimed - replayed|| / ||replayed||
    min_cosine: float


#: CPU float32 replayed on CPU float32: outputs differ only by summation order (threads, BLAS
#: blocking), ~1e-7 relative for these stage sizes (``bench/audit.py`` measures it); a
#: hundredfold margin.
CPU_FLOAT32: Final = Tolerance(1e-5, 1.0 - 1e-8)
#: bf16 autocast on CUDA replayed on CPU float32: bf16 keeps 8 bits of mantissa (relative
#: rounding 2**-9 per operation). Provisional: not yet calibrated on a GPU
#: (``bench/cuda_check.py`` is where to measure it).
CUDA_BF16: Final = Tolerance(5e-2, 0.998)
#: The floor under any tolerance for an output sent in a half dtype (``training.wire_dtype``),
#: by dtype name. Signed output and replay are both rounded to it, so where the float32 sum
#: order moves a value across a rounding boundary they differ by one step of that dtype
#: (2**-8 relative for bfloat16, 2**-11 for float16) in that element; a quarter of a step over
#: the whole tensor lets up to 6 % of the elements differ so. Cosine: 1 - error**2, twice the
#: margin of 1 - error**2 / 2.
HALF_WIRE: Final = {
    "bfloat16": Tolerance(2**-8 / 4, 1.0 - (2**-8 / 4) ** 2),
    "float16": Tolerance(2**-11 / 4, 1.0 - (2**-11 / 4) ** 2),
}
#: By name, as ``gwtf-node audit --tolerance`` takes them. An auditor that cannot tell how the
#: relays computed takes bf16's: a replay of a GPU relay's honest hop is ~1e-3 off on CPU, so
#: CPU's tolerance would accuse it; the price is that errors below bf16's go unseen.
TOLERANCES: Final = {"cpu": CPU_FLOAT32, "bf16": CUDA_BF16}
