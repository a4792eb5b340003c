"""megablox: JAX's grouped matmuls `gmm` and `tgmm`, tuned unedited (megablox.py), the
look-up function their `tiling=` takes (tiling.py) and the group sizes they are tuned on
(workloads.py)."""

from autotune.kernels.megablox.megablox import (
    Tiling,
    gmm_reference,
    megablox_gmm,
    megablox_tgmm,
    tgmm_reference,
)
from autotune.kernels.megablox.tiling import TunedTiling

__all__ = [
    "Tiling",
    "TunedTiling",
    "gmm_reference",
    "megablox_gmm",
    "megablox_tgmm",
    "tgmm_reference",
]
