"""Mosaic TPU, Pallas's backend for TPUs: its interpret mode and its lowering check.

TPU interpret mode runs TPU kernels on a CPU, TPU-only grid specs (scalar prefetch, VMEM
scratch) included; the TPU lowering (which enforces the block-shape rules) runs on a CPU-only
host too. The TPU's memory limits are in `autotune.hardware`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

NAME = "mosaic_tpu"
LOWERING_PLATFORM = "tpu"


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
