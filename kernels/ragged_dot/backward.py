"""The backward both grouped matmuls here share: d lhs is the kernel itself (g times rhs,
transposed per group), d rhs is XLA's (the VJP of megablox's reference): JAX's transposed
Hopper kernel is not wired in."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from autotune.kernels.megablox.megablox import gmm_reference


def lhs_by_kernel(kernel: Callable[[], Callable]) -> Callable:
    """The bwd (`@differentiable`'s) of a grouped matmul whose d lhs is `kernel()` (asked at the
    backward's time: it is defined after its bwd) and whose d rhs is XLA's."""

    def bwd(inputs: tuple, g: Any, *, transpose_rhs: bool, interpret: bool, **_) -> tuple:
        lhs, rhs, group_sizes = inputs
        dlhs = kernel()(
            g.astype(lhs.dtype),
            rhs,
            group_sizes,
            transpose_rhs=not transpose_rhs,
            interpret=interpret,
        )
        xla = functools.partial(gmm_reference, transpose_rhs=transpose_rhs)
        _, rhs_vjp = jax.vjp(lambda r: xla(lhs, r, group_sizes), rhs)
        (drhs,) = rhs_vjp(g.astype(lhs.dtype))
        return dlhs, drhs, None

    return bwd
