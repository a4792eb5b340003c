"""float32 means float32: the shipped kernels' dots ask for it, and the oracle holds them to it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from autotune.kernels import bmm, flash_attention, matmul
from autotune.measure.verify import compare, tolerance

F32 = jax.ShapeDtypeStruct
CALLS = {
    "matmul": (matmul, [F32((40, 24), jnp.float32), F32((24, 56), jnp.float32)], {}),
    "bmm": (bmm, [F32((2, 40, 24), jnp.float32), F32((2, 24, 56), jnp.float32)], {}),
    "flash_attention": (
        flash_attention,
        [F32((1, 2, 40, 16), jnp.float32)] * 3,
        {"causal": True},
    ),
}


def dot_precisions(jaxpr) -> list:
    """The precision of every dot_general in a jaxpr, the kernel bodies and loops inside it."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                if hasattr(inner, "eqns"):
                    found += dot_precisions(inner)
    return found


@pytest.mark.parametrize("name", CALLS)
def test_the_shipped_kernels_multiply_float32_at_the_highest_precision_unless_told(name):
    kernel, args, kwargs = CALLS[name]
    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    fn = functools.partial(kernel, interpret=True, **kwargs)
    precisions = dot_precisions(jax.make_jaxpr(fn)(*args).jaxpr)
    assert precisions and all(p == highest for p in precisions), precisions
    chosen = dot_precisions(jax.make_jaxpr(functools.partial(fn, precision="high"))(*args).jaxpr)
    assert chosen and all(p == (jax.lax.Precision.HIGH,) * 2 for p in chosen), chosen


def test_a_precision_that_is_not_one_of_the_kernels_is_refused_by_name():
    x = jnp.ones((8, 8), jnp.float32)
    with pytest.raises(ValueError, match="precision='tf32': use one of highest, high, default"):
        matmul(x, x, precision="tf32", interpret=True)


def test_the_oracle_tolerance_follows_the_precision_the_kernel_was_called_with():
    oracle = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    tf32_like = oracle + np.float32(1e-3)  # the error of a TF32 dot, ten times float32's bound
    assert not compare(tf32_like, oracle).ok  # float32 unless the call said otherwise
    assert not compare(tf32_like, oracle, "highest").ok
    assert compare(tf32_like, oracle, "high").ok
    assert compare(tf32_like, oracle, jax.lax.Precision.DEFAULT).ok
    assert tolerance(np.float32, "tensorfloat32") == tolerance(np.float32, "high") == 5e-3
    assert tolerance(jnp.bfloat16, "highest") == tolerance(jnp.bfloat16) == 2e-2
