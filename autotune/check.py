"""Static pre-validation that costs no device time: does a candidate lower for a TPU?

On a CPU-only host, `jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",))` runs the Pallas
TPU (Mosaic) lowering, which enforces the block-shape rules; it raises for a block that a TPU
would refuse. Nothing is compiled or run.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any


def tpu_lowering_error(
    kernel: Any,
    config: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
) -> str | None:
    """Why `kernel` at `config` does not lower for TPU with these arguments (None: it lowers).

    `args` may be arrays or jax.ShapeDtypeStruct; `kwargs` are the static arguments.
    """
    import jax

    spec = kernel.spec
    fn = functools.partial(spec.fn, **spec.kernel_kwargs(config), **dict(kwargs or {}))
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    except Exception as e:  # the lowering reports bad blocks as ValueError, others vary
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None
