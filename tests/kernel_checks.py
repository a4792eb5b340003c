"""Helpers shared by the kernel-library tests: inputs, per-dtype comparison, TPU lowering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from autotune.device import DeviceInfo
from autotune.measure.lowering import tpu_lowering_error

# max |out - ref| <= TOL * max(1, max |ref|): float32 differs only in summation order; bfloat16
# results are rounded once more (8 bits of mantissa) than the float32 reference.
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}
TPU = DeviceInfo("tpu", "TPU v5 lite", "mosaic_tpu", jax.__version__, "", "")


def rand(shape, dtype=jnp.float32, seed=0, scale=1.0):
    return (scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)).astype(dtype)


def close(out, ref, dtype, tol=None):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    a, b = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    assert np.isfinite(a).all()
    bound = (TOL[dtype] if tol is None else tol) * max(1.0, float(np.abs(b).max(initial=0)))
    assert np.abs(a - b).max(initial=0) <= bound


def tpu_configs_lower(kernel, args, kwargs, effective) -> int:
    """Lower every configuration of the kernel's TPU space that its constraints admit for this
    call (one per distinct effective block layout); returns how many were checked."""
    sig = kernel.spec.signature(args, kwargs, TPU)
    admitted = kernel.spec.space("tpu").valid_configs(sig)
    assert admitted, f"the TPU space admits nothing for {sig.text}"
    seen = {}
    for config in admitted:
        seen.setdefault(effective(config), config)
    failures = {
        str(c): err
        for c in seen.values()
        if (err := tpu_lowering_error(kernel, c, args, kwargs)) is not None
    }
    assert not failures, failures
    return len(seen)
