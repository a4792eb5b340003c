"""The serving hook for code that calls JAX's megablox itself (MaxText's MoE layer):
`TunedTiling`, a look-up function JAX's `gmm`/`tgmm` take as `tiling=`. JAX calls it with
(m, k, n) while it traces; it answers the tiling tuned for that call (megablox_gmm's or
megablox_tgmm's entry: database, shipped table, overlay, nearest shape, default), so the call
site changes one argument, not its kernel:

    gmm(lhs, rhs, group_sizes, tiling=TunedTiling(num_groups=8, dtype=jnp.bfloat16))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from autotune.kernels.megablox.megablox import megablox_gmm, megablox_tgmm


@dataclasses.dataclass(frozen=True)
class TunedTiling:
    """tiling(m, k, n) -> (tm, tk, tn): the tuned tiling of a gmm (`transpose=False`) or tgmm
    (`transpose=True`) over `num_groups` groups of `dtype` inputs. Frozen and hashable: JAX's
    gmm takes `tiling` as a static argument."""

    num_groups: int
    dtype: Any = "float32"
    transpose: bool = False  # tgmm: the rhs gradient's
    transpose_rhs: bool = False  # gmm's transpose_rhs, as the call passes it

    def __call__(self, m: int, k: int, n: int) -> tuple[int, int, int]:
        s = jax.ShapeDtypeStruct
        sizes = s((self.num_groups,), "int32")
        if self.transpose:
            config = megablox_tgmm.config(s((k, m), self.dtype), s((m, n), self.dtype), sizes)
        else:
            rhs = (self.num_groups, n, k) if self.transpose_rhs else (self.num_groups, k, n)
            config = megablox_gmm.config(
                s((m, k), self.dtype), s(rhs, self.dtype), sizes, transpose_rhs=self.transpose_rhs
            )
        return config["tm"], config["tk"], config["tn"]
