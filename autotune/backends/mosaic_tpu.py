"""Mosaic TPU, Pallas's backend for TPUs: its interpret mode and its lowering check.

TPU interpret mode runs TPU kernels on a CPU, TPU-only grid specs (scalar prefetch, VMEM
scratch) included; the TPU lowering (which enforces the block-shape rules) runs on a CPU-only
host too. The TPU's limits that kernels' constraints use (tiling, VMEM) are in
`autotune.hardware`, beside the helpers the kernels import them with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

NAME = "mosaic_tpu"
TITLE = "Mosaic TPU"  # in messages
PLATFORM = "tpu"
MARKER = "pallas.mosaic."  # where jax._src keeps its compiler parameters (not mosaic_gpu's)
LOWERING_PLATFORM = "tpu"  # what `.lower(lowering_platforms=...)` calls a TPU
# a profiler trace has the XLA module's time on the TPU; CUPTI is NVIDIA's
TIMERS = ("trace", "wall")
COMPILER_PARAMS = "jax.experimental.pallas.tpu.CompilerParams"
KNOBS = ("vmem_limit_bytes",)  # raises the scoped VMEM limit (see hardware.TPU_SCOPED_VMEM)
KIND_PREFIX = "TPU"  # "TPU v5 lite", "TPU v6e", ...


@contextlib.contextmanager
def interpret_mode() -> Iterator[None]:
    """Run every Pallas kernel traced inside under TPU interpret mode (for kernels that take
    no `interpret` argument); Pallas reads it while tracing."""
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode():
        yield


def reset_interpret_state() -> None:
    """Clear TPU interpret mode's simulated memory, which it keeps after a kernel raised."""
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()
