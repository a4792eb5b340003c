"""Every kernel inside `jax.shard_map` with its default check_vma=True, over four host devices:
each kernel model code calls (the registry's: its backward kernels run inside its gradient) at
its example, traced and lowered for a TPU and a GPU (this host lowers both), forward and
backward; and a transformer-style step's loss and gradients against plain JAX's."""

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
from kernel_checks import cuda_runtime_stub, example_call, lowers_for, outermost, with_examples

from autotune import kernels as K
from autotune.backends import lowering_for
from autotune.registry.split import ELLIPSIS

F32 = jnp.float32
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


# what each backend's kernel lowers to: the Pallas call is in the program, not replaced
MARKERS = {"tpu": "tpu_custom_call", "gpu": "triton", "mosaic_gpu": "mosaic_gpu"}
MARKERS.update(mosaic_tpu=MARKERS["tpu"], triton=MARKERS["gpu"])  # a backend declared


def _split_axis(split, axes: str, rank: int) -> int | None:
    """The axis of an array (axes as the kernel's Split names them) that the mesh splits: its
    first batch-like one, or None where the array has none (it is the same on every device)."""
    first = ELLIPSIS if split.along.startswith(ELLIPSIS) else split.along[0]
    if first == ELLIPSIS:
        return 0 if axes.startswith(ELLIPSIS) else None
    letters = axes.replace(ELLIPSIS, "")
    return rank - len(letters) + letters.index(first) if first in letters else None


def _spec(axis: int | None) -> P:
    return SAME if axis is None else P(*([None] * axis), "d")


def _sharded(kernel):
    """The kernel's example over the mesh: each array as (global shape, spec, dtype), its
    batch-like axis (the kernel's Split) split along "d", so that each device's part is the
    example's; the outputs' specs; the static arguments. A kernel that declares no Split has
    every array the same on every device."""
    arrays, static = example_call(kernel)
    split = kernel.spec.split
    outs = jax.eval_shape(functools.partial(kernel.spec.reference, **static), *arrays)
    if split is None:
        return (
            [(a.shape, SAME, a.dtype) for a in arrays],
            jax.tree.map(lambda _: SAME, outs),
            static,
        )
    sharded = []
    for a, axes in zip(arrays, split.inputs):
        axis = _split_axis(split, axes, len(a.shape))
        shape = list(a.shape)
        if axis is not None:
            shape[axis] *= MESH.size
        sharded.append((tuple(shape), _spec(axis), a.dtype))
    leaves, tree = jax.tree.flatten(outs)
    out_specs = [
        _spec(_split_axis(split, axes, len(o.shape))) for o, axes in zip(leaves, split.outputs)
    ]
    return sharded, jax.tree.unflatten(tree, out_specs), static


def _lowered(platform, kernel, grad):
    mesh = _abstract_mesh(platform)
    arrays, out_specs, static = _sharded(kernel)
    args = [S(shape, dtype, sharding=NamedSharding(mesh, spec)) for shape, spec, dtype in arrays]

    def step(*arrays):
        return kernel(*arrays, **static, interpret=False)

    specs = tuple(spec for _, spec, _ in arrays)
    fn = jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=out_specs)
    if grad:  # the backward's own kernels, under the same shard_map
        # the float arrays: integer ones (group sizes) are data, with no gradient
        floats = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))
        fn = jax.grad(lambda *a, f=fn: jnp.sum(f(*a).astype(F32) ** 2), argnums=floats)
    with lowering_for(platform), cuda_runtime_stub():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=(LOWERING[platform],))


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_every_kernel_and_its_gradient_lowers_inside_shard_map(platform):
    # kernels trace once per shape: a trace for the other platform must not be reused
    jax.clear_caches()
    cases = {n: with_examples()[n] for n in outermost() if lowers_for(with_examples()[n], platform)}
    assert {"matmul", "flash_attention"} <= set(cases)
    failed = {}
    for name, kernel in cases.items():
        marker = MARKERS[kernel.spec.backend or platform]
        for grad in (False, True)[: 1 + kernel.spec.differentiates]:
            try:
                text = _lowered(platform, kernel, grad).as_text()
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
    # numpy's generator: jax.random compiles a program at each new shape, a second or more here
    rng = np.random.default_rng(1)
    params = {w: rng.standard_normal((d, d), np.float32) / d**0.5 for w in ("wq", "wk", "wv", "wo")}
    params["g"] = 1.0 + 0.1 * rng.standard_normal((d,), np.float32)
    return params


def test_a_transformer_step_under_shard_map_gives_plain_jax_loss_and_gradients():
    b, s, d, heads = 4, 16, 32, 2
    x = np.random.default_rng(0).standard_normal((b, s, d), np.float32)
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
    # under jit: one compile, not one for each operation of the step and its gradient
    reference = jax.jit(jax.value_and_grad(functools.partial(loss, REFERENCE_OPS), argnums=(0, 1)))
    ref_value, (ref_dparams, ref_dx) = reference(params, x)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(
            dparams[name], ref_dparams[name], rtol=1e-4, atol=1e-6, err_msg=name
        )
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-6)
