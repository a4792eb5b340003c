"""The inputs a tuning task is measured on: random data of its arguments' shapes and dtypes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autotune.errors import SignatureError


def random_inputs(args: Sequence[Any], seed: int = 0) -> list[Any]:
    """Concrete arrays for a call: arrays pass through, ShapeDtypeStructs become random data."""
    import jax
    import jax.numpy as jnp

    # NumPy draws them: jax.random would compile a sampler per shape, harness time per task
    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        if isinstance(a, jax.ShapeDtypeStruct):
            dt = jnp.dtype(a.dtype)
            if jnp.issubdtype(dt, jnp.floating):
                a = jnp.asarray(rng.standard_normal(a.shape, np.float32), dt)
            elif jnp.issubdtype(dt, jnp.integer):
                a = jnp.asarray(rng.integers(-8, 8, a.shape), dt)
            elif dt == jnp.bool_:
                a = jnp.asarray(rng.random(a.shape) < 0.5)
            else:
                raise SignatureError(
                    f"cannot make random inputs of dtype {dt.name}: pass concrete arrays"
                )
        out.append(a)
    return out
