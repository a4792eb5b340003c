"""Gradients through every shipped kernel, and the backward kernels on their own, against the
references' in interpret mode, on awkward shapes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_checks import TPU, close, rand, tpu_configs_lower

from autotune import BestEntry, registry
from autotune.kernels import (
    attention_dkv_reference,
    attention_dq_reference,
    attention_reference,
    bmm,
    bmm_reference,
    flash_attention,
    flash_attention_dkv,
    flash_attention_dq,
    layer_norm,
    layer_norm_bwd,
    layer_norm_bwd_reference,
    layer_norm_reference,
    matmul,
    matmul_reference,
    rms_norm,
    rms_norm_bwd,
    rms_norm_bwd_reference,
    rms_norm_reference,
    softmax,
    softmax_bwd,
    softmax_bwd_reference,
    softmax_reference,
    vector_add,
    vector_add_reference,
)
from autotune.kernels.flash_attention.backward import backward_on
from autotune.kernels.flash_attention.tiles import BlockSizes

S = jax.ShapeDtypeStruct
ROWS = (3, 5, 37)  # 15 rows, a row length no power of two
ATTN = functools.partial(flash_attention, sm_scale=0.3)
ATTN_REF = functools.partial(attention_reference, sm_scale=0.3)

# kernel, its reference, the arrays' shapes: every array is differentiated
CASES = {
    "matmul": (matmul, matmul_reference, [(37, 45), (45, 29)]),
    "bmm": (bmm, bmm_reference, [(2, 7, 9), (2, 9, 5)]),
    "softmax": (softmax, softmax_reference, [ROWS]),
    "rms_norm": (rms_norm, rms_norm_reference, [ROWS, ROWS[-1:]]),
    "layer_norm": (layer_norm, layer_norm_reference, [ROWS, ROWS[-1:], ROWS[-1:]]),
    "vector_add": (vector_add, vector_add_reference, [(300,), (300,)]),
    "flash_attention": (ATTN, ATTN_REF, [(1, 2, 19, 8), (1, 2, 23, 8), (1, 2, 23, 8)]),
}


def _loss(fn, cotangent):
    """A scalar whose gradient is the VJP of `fn` with `cotangent`."""
    return lambda *args: jnp.sum(fn(*args).astype(jnp.float32) * cotangent)


def _inputs(shapes, dtype=jnp.float32):
    return [rand(s, dtype, seed=i, scale=2.0) + 0.5 for i, s in enumerate(shapes)]


def test_a_bf16_flash_attention_gradient_keeps_to_the_bf16_tolerance():
    # the forward's scores must be those the backward recomputes from the saved log-sum-exp:
    # a q scaled and rounded to bf16 again in the forward put the gradients 4-6% off
    args = _inputs([(1, 2, 128, 64)] * 3, jnp.bfloat16)
    options = dict(sm_scale=0.3, block_q=32, block_k=32)
    cotangent = rand((1, 2, 128, 64), seed=9)
    grads = jax.grad(_loss(functools.partial(flash_attention, **options), cotangent), (0, 1, 2))
    refs = jax.grad(
        _loss(functools.partial(attention_reference, sm_scale=0.3), cotangent), (0, 1, 2)
    )
    for g, r in zip(grads(*args), refs(*args)):
        close(g, r, jnp.bfloat16)


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_matches_the_references_under_jit(name):
    kernel, reference, shapes = CASES[name]
    args = _inputs(shapes)
    cotangent = rand(jax.eval_shape(reference, *args).shape, seed=9)
    argnums = tuple(range(len(args)))
    value, grads = jax.jit(jax.value_and_grad(_loss(kernel, cotangent), argnums))(*args)
    ref_value, ref_grads = jax.value_and_grad(_loss(reference, cotangent), argnums)(*args)
    close(value, ref_value, jnp.float32)
    for g, r in zip(grads, ref_grads):
        close(g, r, jnp.float32)


def test_eager_vjp_and_grad_and_bfloat16():
    x = rand(ROWS, seed=1)
    g = rand(ROWS, seed=2)
    out, vjp = jax.vjp(softmax, x)
    close(out, softmax_reference(x), jnp.float32)
    close(vjp(g)[0], jax.vjp(softmax_reference, x)[1](g)[0], jnp.float32)
    xb, wb = rand(ROWS, jnp.bfloat16, 3), rand(ROWS[-1:], jnp.bfloat16, 4) + 1
    grads = jax.grad(_loss(rms_norm, g), (0, 1))(xb, wb)
    refs = jax.grad(_loss(rms_norm_reference, g), (0, 1))(xb, wb)
    for a, b in zip(grads, refs):
        close(a, b, jnp.bfloat16)


# each backward kernel at blocks smaller than its shape: several blocks, padded rows and keys
ROW_KERNELS = [
    (softmax_bwd, softmax_bwd_reference, [ROWS, ROWS]),
    (rms_norm_bwd, rms_norm_bwd_reference, [ROWS, ROWS[-1:], ROWS]),
    (layer_norm_bwd, layer_norm_bwd_reference, [ROWS, ROWS[-1:], ROWS]),
]


@pytest.mark.parametrize("kernel, reference, shapes", ROW_KERNELS, ids=lambda v: "")
def test_row_backward_kernels_match_the_vjp_of_the_forward_reference(kernel, reference, shapes):
    args = _inputs(shapes)
    out = kernel(*args, block_rows=8)
    jax.tree.map(lambda o, r: close(o, r, jnp.float32), out, reference(*args))


def test_flash_attention_backward_kernels_skip_causal_blocks_and_match_the_true_gradient():
    # 37 queries over 29 keys in blocks of 16: padded rows and keys, blocks above the diagonal;
    # in the GPU layout, which also pads D = 12 to 16 lanes (run here in interpret mode)
    q, k, v = (rand(s, seed=i) for i, s in enumerate([(1, 2, 37, 12)] + [(1, 2, 29, 12)] * 2))
    do = rand(q.shape, seed=7)
    out, vjp = jax.vjp(functools.partial(attention_reference, causal=True), q, k, v)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(12)
    lse = jax.nn.logsumexp(jnp.where(jnp.tril(jnp.ones((37, 29), bool)), s, -jnp.inf), axis=-1)
    delta = jnp.sum(out * do, axis=-1)
    blocks = BlockSizes(block_q=16, block_k=16, num_warps=4, num_stages=2)
    options = dict(causal=True, sm_scale=None, block_sizes=blocks, precision="highest",
                   platform="gpu", interpret=True)  # fmt: skip
    dq = jax.jit(functools.partial(backward_on, "dq", **options))
    dkv = jax.jit(functools.partial(backward_on, "dkv", **options))
    for got, want in zip(dq(q, k, v, do, lse, delta) + dkv(q, k, v, do, lse, delta), vjp(do)):
        close(got, want, jnp.float32)
    # the registered references agree with the kernels on any lse and delta (the oracle's inputs)
    lse, delta = rand(lse.shape, seed=11), rand(delta.shape, seed=12)
    refs = [attention_dq_reference(q, k, v, do, lse, delta, causal=True),
            *attention_dkv_reference(q, k, v, do, lse, delta, causal=True)]  # fmt: skip
    for got, want in zip(dq(q, k, v, do, lse, delta) + dkv(q, k, v, do, lse, delta), refs):
        close(got, want, jnp.float32)


BACKWARD = ["softmax_bwd", "rms_norm_bwd", "layer_norm_bwd", "flash_attention_dq",
            "flash_attention_dkv"]  # fmt: skip


def test_backward_kernels_are_registered_with_spaces_of_their_own():
    kernels = registry.registered()
    for name in BACKWARD:
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
    grads = jax.grad(_loss(functools.partial(matmul_mgpu, **tiles), cotangent), (0, 1))(x, y)
    refs = jax.grad(_loss(matmul_mgpu_reference, cotangent), (0, 1))(x, y)
    for g, r in zip(grads, refs):
        close(g, r, jnp.bfloat16)
