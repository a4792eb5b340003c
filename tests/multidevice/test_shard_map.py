"""Every shipped kernel inside `jax.shard_map` with its default check_vma=True, over four host
devices: traced and lowered for a TPU and a GPU (this host lowers both), forward and backward,
and a transformer-style step's loss and gradients against plain JAX's."""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from autotune import kernels as K
from autotune.backends import lowering_for

F32, BF16 = jnp.float32, jnp.bfloat16
S = jax.ShapeDtypeStruct
MESH = jax.make_mesh((4,), ("d",))
ROWS, SAME = P("d"), P()
LOWERING = {"tpu": "tpu", "gpu": "cuda"}
# lowered for a device this host lacks: a mesh of four such devices, described, not present
KINDS = {"tpu": "TPU v5 lite", "gpu": "NVIDIA H200"}


def _abstract_mesh(platform):
    device = jax.sharding.AbstractDevice(KINDS[platform], None, platform)
    return jax.sharding.AbstractMesh(
        (4,), ("d",), (jax.sharding.AxisType.Explicit,), abstract_device=device
    )


# name: the kernel, its arrays as (global shape, spec: split along "d" or the same on every
# device), their dtype; each is called with interpret=False, so the device's own body is traced
KERNELS = {
    "rms_norm": (K.rms_norm, [((64, 96), ROWS), ((96,), SAME)], F32),
    "layer_norm": (K.layer_norm, [((64, 96), ROWS), ((96,), SAME), ((96,), SAME)], F32),
    "softmax": (K.softmax, [((64, 96), ROWS)], F32),
    "matmul": (K.matmul, [((64, 48), ROWS), ((48, 40), SAME)], F32),
    "bmm": (K.bmm, [((4, 16, 24), ROWS), ((4, 24, 8), ROWS)], F32),
    "flash_attention": (
        functools.partial(K.flash_attention, causal=True),
        [((4, 2, 16, 16), ROWS)] * 3,
        F32,
    ),
    "vector_add": (K.vector_add, [((1024,), ROWS)] * 2, F32),
}
MOSAIC_GPU = {"matmul_mgpu": (K.matmul_mgpu, [((256, 128), ROWS), ((128, 128), SAME)], BF16)}
# what each backend's kernel lowers to: the Pallas call is in the program, not replaced
MARKERS = {"tpu": "tpu_custom_call", "gpu": "triton", "mosaic_gpu": "mosaic_gpu"}


def _lowered(platform, kernel, arrays, dtype, grad):
    mesh = _abstract_mesh(platform)
    args = [S(shape, dtype, sharding=NamedSharding(mesh, spec)) for shape, spec in arrays]

    def step(*arrays):
        return kernel(*arrays, interpret=False)

    specs = tuple(spec for _, spec in arrays)
    fn = jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=ROWS)
    if grad:  # the backward's own kernels, under the same shard_map
        fn = jax.grad(
            lambda *a, f=fn: jnp.sum(f(*a).astype(F32) ** 2), argnums=tuple(range(len(args)))
        )
    with lowering_for(platform):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=(LOWERING[platform],))


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_every_kernel_and_its_gradient_lowers_inside_shard_map(platform):
    # kernels trace once per shape: a trace for the other platform must not be reused
    jax.clear_caches()
    cases = {**KERNELS, **(MOSAIC_GPU if platform == "gpu" else {})}
    failed = {}
    for name, (kernel, arrays, dtype) in cases.items():
        marker = MARKERS["mosaic_gpu" if name in MOSAIC_GPU else platform]
        for grad in (False, True):
            try:
                text = _lowered(platform, kernel, arrays, dtype, grad).as_text()
            except Exception as e:  # every kernel's failure is listed
                failed[f"{name}{' grad' if grad else ''}"] = f"{type(e).__name__}: {e}"[:300]
                continue
            assert marker in text, name
    assert failed == {}


def test_the_plain_interpreter_under_check_vma_says_the_recipe_before_jaxs_error(caplog):
    x = jax.device_put(jnp.ones((64, 32), F32), NamedSharding(MESH, ROWS))

    def step(check_vma):
        return jax.jit(
            jax.shard_map(K.softmax, mesh=MESH, in_specs=ROWS, out_specs=ROWS, check_vma=check_vma)
        )

    def hints():
        return [r.getMessage() for r in caplog.records if "plain interpreter" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="autotune"):
        step(False)(x)  # nothing varies in the types: it runs, and nothing is said
        assert hints() == []
        with pytest.raises((ValueError, TypeError)):  # JAX's, raised while it lowers the step
            step(True)(x)
    [hint] = hints()
    assert "force_tpu_interpret_mode()" in hint
    assert "jax.lax.pcast(params, ('d',), to='varying')" in hint


def _rows(x):
    return x.reshape(-1, x.shape[-1])


def _block(ops, x, params, heads):
    """A transformer block's attention half on x [B, S, D]: norm, q/k/v projections, causal
    attention over `heads` heads, the output projection, a residual; `ops` the kernels."""
    norm, matmul, attention = ops
    b, s, d = x.shape
    h = norm(_rows(x), params["g"])
    q, k, v = (matmul(h, params[w]) for w in ("wq", "wk", "wv"))
    q, k, v = (t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3) for t in (q, k, v))
    o = attention(q, k, v).transpose(0, 2, 1, 3).reshape(b * s, d)
    return x + matmul(o, params["wo"]).reshape(b, s, d)


KERNEL_OPS = (K.rms_norm, K.matmul, functools.partial(K.flash_attention, causal=True))
REFERENCE_OPS = (
    K.rms_norm_reference,
    K.matmul_reference,
    functools.partial(K.attention_reference, causal=True),
)


def _params(d):
    keys = jax.random.split(jax.random.key(1), 5)
    params = {
        w: jax.random.normal(kk, (d, d), F32) / d**0.5
        for w, kk in zip(("wq", "wk", "wv", "wo"), keys)
    }
    params["g"] = 1.0 + 0.1 * jax.random.normal(keys[4], (d,), F32)
    return params


def test_a_transformer_step_under_shard_map_gives_plain_jax_loss_and_gradients():
    b, s, d, heads = 4, 16, 32, 2
    x = jax.random.normal(jax.random.key(0), (b, s, d), F32)
    params = _params(d)

    def loss(ops, params, x):
        return jnp.mean(_block(ops, x, params, heads) ** 2)

    def local(params, x):
        # Each device holds one batch row and returns its own loss and gradients, reduced below
        # outside the program: TPU interpret mode holds every device at a barrier in each kernel,
        # and XLA's CPU runtime may start a collective of the same program (a pmean, or the psum
        # that a replicated parameter's gradient gets) first on some device, which then waits for
        # devices that wait at the barrier (a deadlock seen on 2-core hosts).
        params = jax.lax.pcast(params, ("d",), to="varying")
        value, grads = jax.value_and_grad(loss, argnums=(1, 2))(KERNEL_OPS, params, x)
        return value[None], jax.tree.map(lambda g: g[None], grads[0]), grads[1]

    sharded = jax.shard_map(local, mesh=MESH, in_specs=(SAME, ROWS), out_specs=ROWS)
    with pltpu.force_tpu_interpret_mode():
        values, dparams, dx = jax.jit(sharded)(params, jax.device_put(x, NamedSharding(MESH, ROWS)))
    devices = MESH.size  # the loss is the mean of the devices' losses
    value = np.mean(values)
    dparams = {name: np.sum(g, axis=0) / devices for name, g in dparams.items()}
    dx = np.asarray(dx) / devices
    ref_value, (ref_dparams, ref_dx) = jax.value_and_grad(loss, argnums=(1, 2))(
        REFERENCE_OPS, params, x
    )
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(
            dparams[name], ref_dparams[name], rtol=1e-4, atol=1e-6, err_msg=name
        )
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-6)
