"""Gradients through every kernel that declares a backward, and the backward kernels on their
own, against the references' in interpret mode, on awkward shapes: each kernel as the registry
lists it, at its example call."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_checks import (
    TPU,
    backward_kernels,
    check_gradient,
    close,
    differentiable,
    example_inputs,
    loss,
    rand,
    runs_here,
    tpu_configs_lower,
    with_examples,
)

from autotune import BestEntry, registry
from autotune.kernels import (
    attention_dkv_reference,
    attention_dq_reference,
    attention_reference,
    flash_attention,
    flash_attention_dkv,
    flash_attention_dq,
    rms_norm,
    rms_norm_bwd,
    rms_norm_reference,
    softmax,
    softmax_bwd,
    softmax_reference,
)
from autotune.kernels.flash_attention.backward import backward_on
from autotune.kernels.flash_attention.tiles import BlockSizes

S = jax.ShapeDtypeStruct
ROWS = (3, 5, 37)  # 15 rows, a row length no power of two


def _inputs(shapes, dtype=jnp.float32):
    return [rand(s, dtype, seed=i, scale=2.0) + 0.5 for i, s in enumerate(shapes)]


def test_a_bf16_flash_attention_gradient_keeps_to_the_bf16_tolerance():
    # the forward's scores must be those the backward recomputes from the saved log-sum-exp:
    # a q scaled and rounded to bf16 again in the forward put the gradients 4-6% off
    args = _inputs([(1, 2, 128, 64)] * 3, jnp.bfloat16)
    options = dict(sm_scale=0.3, block_q=32, block_k=32)
    cotangent = rand((1, 2, 128, 64), seed=9)
    grads = jax.grad(loss(functools.partial(flash_attention, **options), cotangent), (0, 1, 2))
    refs = jax.grad(
        loss(functools.partial(attention_reference, sm_scale=0.3), cotangent), (0, 1, 2)
    )
    for g, r in zip(grads(*args), refs(*args)):
        close(g, r, jnp.bfloat16)


@pytest.mark.parametrize("name", differentiable())
def test_gradient_matches_the_references_under_jit_and_calls_the_declared_backward(name):
    check_gradient(with_examples()[name])


def test_eager_vjp_and_grad_and_bfloat16():
    x = rand(ROWS, seed=1)
    g = rand(ROWS, seed=2)
    out, vjp = jax.vjp(softmax, x)
    close(out, softmax_reference(x), jnp.float32)
    close(vjp(g)[0], jax.vjp(softmax_reference, x)[1](g)[0], jnp.float32)
    xb, wb = rand(ROWS, jnp.bfloat16, 3), rand(ROWS[-1:], jnp.bfloat16, 4) + 1
    grads = jax.grad(loss(rms_norm, g), (0, 1))(xb, wb)
    refs = jax.grad(loss(rms_norm_reference, g), (0, 1))(xb, wb)
    for a, b in zip(grads, refs):
        close(a, b, jnp.bfloat16)


@pytest.mark.parametrize(
    "name", sorted(n for n in backward_kernels() if runs_here(with_examples()[n]))
)
def test_backward_kernels_match_their_references_at_their_smallest_blocks(name):
    # each at its example with its CPU space's smallest blocks: several blocks, padded rows and
    # keys; its reference is the VJP of the forward's (in the saved lse and delta for flash
    # attention's, so that it is defined on any inputs)
    kernel = with_examples()[name]
    args, static = example_inputs(kernel)
    smallest = {p.name: p.values[0] for p in kernel.spec.spaces["cpu"]}
    out = kernel(*args, **static, **smallest)
    # the reference under jit: one compile, not one an operation
    ref = jax.jit(functools.partial(kernel.spec.reference, **static))(*args)
    jax.tree.map(lambda o, r: close(o, r, jnp.float32), out, ref)


def test_flash_attention_backward_kernels_skip_causal_blocks_and_match_the_true_gradient():
    # 37 queries over 29 keys in blocks of 16: padded rows and keys, blocks above the diagonal;
    # in the GPU layout, which also pads D = 12 to 16 lanes (run here in interpret mode)
    q, k, v = (rand(s, seed=i) for i, s in enumerate([(1, 2, 37, 12)] + [(1, 2, 29, 12)] * 2))
    do = rand(q.shape, seed=7)

    @jax.jit  # one compile, not one per operation: the true gradient, lse and delta
    def truth(q, k, v, do):
        out, vjp = jax.vjp(functools.partial(attention_reference, causal=True), q, k, v)
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(12)
        visible = jnp.tril(jnp.ones((37, 29), bool))
        lse = jax.nn.logsumexp(jnp.where(visible, s, -jnp.inf), axis=-1)
        return vjp(do), lse, jnp.sum(out * do, axis=-1)

    want, lse, delta = truth(q, k, v, do)
    blocks = BlockSizes(block_q=16, block_k=16, num_warps=4, num_stages=2)
    options = dict(causal=True, sm_scale=None, block_sizes=blocks, precision="highest",
                   platform="gpu", interpret=True)  # fmt: skip
    dq = jax.jit(functools.partial(backward_on, "dq", **options))
    dkv = jax.jit(functools.partial(backward_on, "dkv", **options))
    for got, ref in zip(dq(q, k, v, do, lse, delta) + dkv(q, k, v, do, lse, delta), want):
        close(got, ref, jnp.float32)
    # the registered references agree with the kernels on any lse and delta (the oracle's inputs)
    lse, delta = rand(lse.shape, seed=11), rand(delta.shape, seed=12)
    refs = jax.jit(lambda *a: [attention_dq_reference(*a, causal=True),
                               *attention_dkv_reference(*a, causal=True)])  # fmt: skip
    for got, ref in zip(dq(q, k, v, do, lse, delta) + dkv(q, k, v, do, lse, delta),
                        refs(q, k, v, do, lse, delta)):  # fmt: skip
        close(got, ref, jnp.float32)


def test_backward_kernels_are_registered_with_spaces_of_their_own():
    kernels = registry.registered()
    assert backward_kernels() >= {"softmax_bwd", "flash_attention_dq", "attention_mgpu_bwd"}
    for name in backward_kernels():
        spec = kernels[name].spec
        assert spec.reference is not None and spec.constraints
        assert set(spec.spaces) >= {"cpu", "tpu", "gpu"}


def test_every_admitted_tpu_config_of_the_backward_kernels_lowers():
    q, rows = S((1, 2, 256, 128), jnp.float32), S((1, 2, 256), jnp.float32)
    for kernel in (flash_attention_dq, flash_attention_dkv):
        n = tpu_configs_lower(
            kernel, [q, q, q, q, rows, rows], {"causal": True}, lambda c: tuple(c.values())
        )
        assert n >= 4
    x, w = S((300, 256), jnp.float32), S((256,), jnp.float32)
    for kernel, args in ((softmax_bwd, [x, x]), (rms_norm_bwd, [x, w, x])):
        sig = kernel.spec.signature(args, {}, TPU)
        assert kernel.spec.space("tpu").valid_configs(sig)
        assert tpu_configs_lower(kernel, args, {}, lambda c: c["block_rows"]) >= 3


def _store(db_url, kernel, args, config):
    """A tuned entry for kernel(*args) on this device, as a tuning run stores it."""
    from autotune import TuningDB
    from autotune.device import current_device
    from autotune.trial import TrialRecord

    device = current_device()
    key = kernel.spec.key(kernel.spec.signature(args, {}, device), device)
    with TuningDB(db_url) as db:
        (trial_id,) = db.add_trials(key, "run", [TrialRecord(config, "ok")])
        entry = BestEntry(
            config,
            time_s=1e-3,
            default_time_s=2e-3,
            speedup=2.0,
            n_trials=1,
            trial_id=trial_id,
            run_id="run",
            strategy="tpe",
        )
        db.put_best(key, entry)


def test_matmul_mgpu_gradient_is_two_matmul_mgpu_calls_served_their_tuned_configs(db_url):
    pytest.importorskip("absl", reason="Mosaic GPU imports absl: pip install absl-py")
    from autotune import configure
    from autotune.kernels import matmul_mgpu, matmul_mgpu_reference

    # GPU interpret mode at small tiles
    tiles = {**matmul_mgpu.spec.defaults, "tile_m": 64, "tile_n": 64, "wg_dimension": "m",
             "max_concurrent_steps": 2}  # fmt: skip
    x, y = rand((100, 200), jnp.bfloat16, 0), rand((200, 72), jnp.bfloat16, 1)
    bf16 = functools.partial(S, dtype=jnp.bfloat16)
    _store(db_url, matmul_mgpu, [bf16((100, 72)), bf16((72, 200))], tiles)  # dx = g y^T
    _store(db_url, matmul_mgpu, [bf16((200, 100)), bf16((100, 72))], tiles)  # dy = x^T g
    configure()
    cotangent = rand((100, 72), seed=2)
    grads = jax.grad(loss(functools.partial(matmul_mgpu, **tiles), cotangent), (0, 1))(x, y)
    refs = jax.grad(loss(matmul_mgpu_reference, cotangent), (0, 1))(x, y)
    for g, r in zip(grads, refs):
        close(g, r, jnp.bfloat16)
