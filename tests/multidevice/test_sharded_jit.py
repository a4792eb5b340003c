"""Kernels called under `jax.jit` on arrays sharded over a mesh of four host devices (Explicit
axes, `jax.make_mesh`'s default): each device runs the kernel on its part, looked up at its
local shape, and the result keeps the sharding of the batch-like axes; an axis the kernel
cannot split along is gathered, with one warning."""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_shard_map import KERNEL_OPS, LOWERING, MARKERS, REFERENCE_OPS, _abstract_mesh

import autotune
from autotune import TuningDB
from autotune import kernels as K
from autotune.backends import lowering_for

F32 = jnp.float32
S = jax.ShapeDtypeStruct
MESH = jax.make_mesh((4,), ("d",))


def _put(shape, spec, seed=0):
    # numpy's generator: jax.random compiles a program at each new shape, a second or more here
    x = np.random.default_rng(seed).standard_normal(shape, np.float32)
    return jax.device_put(x, NamedSharding(MESH, spec))


def test_a_jitted_matmul_on_row_sharded_x_keeps_its_rows_sharded_and_looks_up_each_part(db_url):
    x, y = _put((64, 32), P("d")), _put((32, 16), P(), seed=1)
    assert K.matmul.explain(x, y)["signature"] == "f32[16,32],f32[32,16]"
    out = jax.jit(K.matmul)(x, y)
    assert out.sharding.spec == P("d", None)
    np.testing.assert_allclose(out, np.asarray(x) @ np.asarray(y), rtol=1e-5, atol=1e-5)
    # looked up (and missed) at each device's shape, never at the global one
    misses = TuningDB(db_url).misses(kernel="matmul")
    assert [m["signature"] for m in misses] == ["f32[16,32],f32[32,16]"]


def test_a_row_kernel_splits_along_every_leading_axis():
    x, g = _put((8, 4, 32), P(None, "d")), _put((32,), P(), seed=1)
    out = jax.jit(K.rms_norm)(x, g)
    assert out.sharding.spec == P(None, "d", None)
    np.testing.assert_allclose(out, K.rms_norm_reference(np.asarray(x), g), rtol=1e-5, atol=1e-6)


def test_a_contracted_axis_sharded_is_gathered_with_one_warning(caplog):
    x, y = _put((16, 64), P(None, "d")), _put((64, 8), P("d"), seed=1)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        outs = [jax.jit(K.matmul)(x, y) for _ in range(2)]
        K.matmul(x, y)  # eager: the same call, warned already
    for out in outs:
        np.testing.assert_allclose(out, np.asarray(x) @ np.asarray(y), rtol=1e-5, atol=1e-5)
    warned = [r.getMessage() for r in caplog.records if "gathered" in r.getMessage()]
    assert len(warned) == 2, warned  # x's axis 1 and y's axis 0, each once
    assert "matmul: x's axis 1 (over mesh axis 'd') is gathered" in warned[0]
    [call] = autotune.calls_in(jax.jit(K.matmul), (x, y))
    assert call.gathered == ("x's axis 1 (over mesh axis 'd')", "y's axis 0 (over mesh axis 'd')")


def test_a_step_under_sharded_jit_gives_plain_jax_loss_and_gradients():
    """Norm and matmul on rows sharded over the devices, attention on heads: loss and
    gradients as plain JAX's, each gradient sharded as its input."""
    x, qkv = _put((64, 32), P("d")), _put((3, 2, 4, 16, 16), P(None, None, "d"), seed=1)
    params = {"g": _put((32,), P(), seed=2), "w": _put((32, 32), P(), seed=3)}

    def loss(ops, params, x, qkv):
        norm, matmul, attention = ops
        h = matmul(norm(x, params["g"]), params["w"])
        return jnp.mean(h**2) + jnp.mean(attention(*qkv) ** 2)

    with jax.set_mesh(MESH):
        step = jax.jit(jax.value_and_grad(functools.partial(loss, KERNEL_OPS), argnums=(0, 1, 2)))
        value, grads = step(params, x, qkv)
    assert grads[1].sharding.spec == P("d", None)
    assert grads[2].sharding.spec == P(None, None, "d", None, None)
    plain = jax.tree.map(np.asarray, (params, x, qkv))
    # under jit: one compile, not one for each operation of the step and its gradient
    reference = jax.jit(
        jax.value_and_grad(functools.partial(loss, REFERENCE_OPS), argnums=(0, 1, 2))
    )
    ref_value, ref_grads = reference(*plain)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_a_sharded_call_and_its_gradient_lower_for_a_device_mesh(platform):
    """Lowered for four TPUs or GPUs this host lacks: each device's own kernel body, the
    batch-like axes' sharding kept."""
    jax.clear_caches()  # kernels trace once per shape: not the other platform's trace
    mesh = _abstract_mesh(platform)
    x = S((64, 32), F32, sharding=NamedSharding(mesh, P("d")))
    w = S((32, 16), F32, sharding=NamedSharding(mesh, P()))

    def loss(x, w):
        return jnp.sum(K.matmul(x, w, interpret=False) ** 2)

    with lowering_for(platform), jax.sharding.use_abstract_mesh(mesh):
        traced = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).trace(x, w)
        text = traced.lower(lowering_platforms=(LOWERING[platform],)).as_text()
    assert MARKERS[platform] in text
    _, (dx, dw) = traced.out_info
    assert dx.sharding.spec == P("d", None) and dw.sharding.spec == P(None, None)
