"""JAX's Triton attention kernels tuned unedited (kernels/gpu_attention/): triton_attention
(JAX's attention.mha, forward and backward tuned apart) and decode_attention (JAX's
decode_attention.gqa), against plain-JAX references in interpret mode on awkward shapes, and
their constraints against JAX's own rules. No GPU runs here: what a GPU compiles is
test_triton_check.py's (every registered Triton kernel lowers for one on this host)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from kernel_checks import close, rand

from autotune.device import DeviceInfo
from autotune.kernels import gpu_attention

if not gpu_attention.JAX_HAS_THEM:
    pytest.skip(f"JAX {jax.__version__} ships no Triton ops", allow_module_level=True)

from autotune.kernels import (  # noqa: E402
    attention_reference,
    attention_variants,
    decode_attention,
    decode_attention_reference,
    triton_attention,
    triton_attention_bwd,
)
from autotune.kernels.gpu_attention.decode import fits_gpu as decode_fits  # noqa: E402
from autotune.kernels.gpu_attention.triton_attention import (  # noqa: E402
    fits_gpu,
    fits_gpu_bwd,
)

S = jax.ShapeDtypeStruct
H100 = DeviceInfo("gpu", "NVIDIA H100 80GB HBM3", "triton", jax.__version__, "", "")


def _qkv(b, h, sq, sk, d, dtype=jnp.float32):
    return (
        rand((b, h, sq, d), dtype, 0),
        rand((b, h, sk, d), dtype, 1),
        rand((b, h, sk, d), dtype, 2),
    )


@pytest.mark.parametrize(
    "sq, sk, d, causal, blocks",
    [
        (48, 96, 24, False, dict(block_q=16, block_k=32)),  # 3 blocks each; head_dim padded
        (64, 64, 32, True, dict(block_q=32, block_k=16)),
    ],
)
def test_triton_attention_matches_the_reference_and_its_gradient_too(sq, sk, d, causal, blocks):
    from autotune.kernels.gpu_attention.triton_attention import BlockSizes

    q, k, v = _qkv(1, 2, sq, sk, d)
    options = dict(causal=causal, sm_scale=0.3)
    out = triton_attention(q, k, v, **options, block_sizes=BlockSizes(**blocks), interpret=True)
    close(out, attention_reference(q, k, v, **options), jnp.float32)

    def loss(f):
        return lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v, **options)))

    got = jax.grad(loss(triton_attention), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(attention_reference), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        close(g, w, jnp.float32)


@pytest.mark.parametrize("hq, hkv, seq, splits", [(4, 2, 64, 2), (3, 3, 48, 1)])
def test_decode_attention_matches_the_reference_grouped_or_not(hq, hkv, seq, splits):
    from autotune.kernels.gpu_attention.decode import BlockSizes

    q = rand((2, hq, 32), jnp.float32, 0)
    k, v = rand((2, seq, hkv, 32), jnp.float32, 1), rand((2, seq, hkv, 32), jnp.float32, 2)
    blocks = BlockSizes(block_k=16, k_splits=splits)
    out = decode_attention(q, k, v, block_sizes=blocks, interpret=True)
    close(out, decode_attention_reference(q, k, v), jnp.float32)


def test_decode_attention_refuses_heads_that_do_not_group_in_one_line():
    q, k = S((1, 3, 32), jnp.float32), S((1, 64, 2, 32), jnp.float32)
    with pytest.raises(ValueError, match="q's 3 heads must be a multiple of k's 2"):
        jax.eval_shape(lambda q, k: decode_attention(q, k, k, interpret=True), q, k)


def _sig(kernel, *shapes, device=H100):
    return kernel.spec.signature([S(s, jnp.bfloat16) for s in shapes], {}, device)


def test_the_constraints_hold_jaxs_rules():
    qkv = [(1, 2, 48, 64)] * 3
    sig = _sig(triton_attention, *qkv)
    base = dict(num_warps=4, num_stages=2)
    assert fits_gpu({"block_q": 16, "block_k": 16, **base}, sig)
    assert not fits_gpu({"block_q": 32, "block_k": 16, **base}, sig)  # 48 / 32
    assert fits_gpu(
        {"block_q": 64, "block_k": 64, **base}, _sig(triton_attention, *[(1, 2, 64, 64)] * 3)
    )
    # 128 x 128 blocks at head_dim 128 keep 256 registers a thread of float32 tiles on 4 warps
    big = _sig(triton_attention, *[(1, 2, 256, 128)] * 3)
    assert not fits_gpu({"block_q": 128, "block_k": 128, **base}, big)
    assert fits_gpu({"block_q": 128, "block_k": 128, "num_warps": 8, "num_stages": 2}, big)

    bwd = _sig(
        triton_attention_bwd, *[(1, 2, 64, 64)] * 3, (1, 2, 64, 64), (1, 2, 64), (1, 2, 64, 64)
    )
    same = dict(block_q_dkv=16, block_kv_dkv=32, block_q_dq=32, block_kv_dq=16, num_warps=4)
    assert fits_gpu_bwd(same, bwd)
    assert not fits_gpu_bwd({**same, "block_q_dq": 16}, bwd)  # 4 dq blocks, 2 dk/dv blocks

    dec = _sig(decode_attention, (2, 8, 64), (2, 64, 2, 64), (2, 64, 2, 64))
    config = dict(block_h=16, block_k=16, k_splits=4, num_warps=4, num_stages=2)
    assert decode_fits(config, dec)
    assert not decode_fits({**config, "k_splits": 8}, dec)  # 8 keys a split, under 16
    assert not decode_fits({**config, "block_h": 32}, dec)  # 4 heads a group: padding only


def test_triton_attention_is_a_gpu_member_of_attention_variants():
    members = attention_variants.members
    cpu = DeviceInfo("cpu", "cpu", "interpret", jax.__version__, "", "")
    assert "triton" in members
    assert members["triton"].why_not(H100) is None
    assert "GPU" in members["triton"].why_not(cpu)
