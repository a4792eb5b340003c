"""flash_attention against the plain-JAX reference, in interpret mode."""

import json

import jax
import jax.numpy as jnp
import pytest
from kernel_checks import close, rand, tpu_configs_lower

from autotune.kernels import attention_reference, flash_attention
from autotune.kernels.flash_attention.forward import attention_on
from autotune.kernels.flash_attention.tiles import BlockSizes

S = jax.ShapeDtypeStruct


def qkv(b, h, sq, sk, d, dtype=jnp.float32):
    return (
        rand((b, h, sq, d), dtype, 1),
        rand((b, h, sk, d), dtype, 2),
        rand((b, h, sk, d), dtype, 3),
    )


# multiples of the blocks, default 1/sqrt(d)
EVEN = (1, 2, 64, 64, 32), (32, 32), None
# 50 queries in blocks of 32, 70 keys in blocks of 32: 26 padded keys to mask out
PADDED = (2, 1, 50, 70, 24), (32, 32), 0.3


# every pair of shape, masking and dtype, in four calls rather than all eight combinations:
# each shape causal and not and in each dtype, each dtype causal and not
@pytest.mark.parametrize(
    "dims, blocks, sm_scale, causal, dtype",
    [
        (*EVEN, False, jnp.float32),
        (*EVEN, True, jnp.bfloat16),
        (*PADDED, False, jnp.bfloat16),
        (*PADDED, True, jnp.float32),
    ],
)
def test_flash_attention_matches_reference(dims, blocks, sm_scale, causal, dtype):
    q, k, v = qkv(*dims, dtype)
    bq, bk = blocks
    out = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, block_q=bq, block_k=bk)
    close(out, attention_reference(q, k, v, causal=causal, sm_scale=sm_scale), dtype)


def test_flash_attention_gpu_layout_pads_head_dim_and_masks_keys():
    # The GPU layout pads head_dim 24 to 32 and uses power-of-two blocks; interpret mode here.
    q, k, v = qkv(2, 1, 50, 70, 24)
    out = attention_on(
        q,
        k,
        v,
        causal=True,
        sm_scale=None,
        block_sizes=BlockSizes(block_q=16, block_k=64, num_warps=4, num_stages=2),
        platform="gpu",
        interpret=True,
    )
    close(out, attention_reference(q, k, v, causal=True), jnp.float32)


def test_flash_attention_single_token_and_vmap():
    q, k, v = qkv(1, 1, 1, 1, 8)
    close(flash_attention(q, k, v, causal=True), attention_reference(q, k, v), jnp.float32)
    q, k, v = (jnp.stack([a, a * 0.5]) for a in qkv(1, 2, 40, 40, 16))
    attend = jax.jit(jax.vmap(lambda q, k, v: flash_attention(q, k, v, block_q=16, block_k=16)))
    close(attend(q, k, v), jax.vmap(attention_reference)(q, k, v), jnp.float32)


def test_flash_attention_rejects_bad_shapes():
    q, k, v = qkv(1, 2, 16, 16, 8)
    with pytest.raises(ValueError, match=r"\[batch, heads, seq, head_dim\]"):
        flash_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="k and v of one shape"):
        flash_attention(q, k, v[:, :, :8])
    with pytest.raises(ValueError, match="at least one key"):
        flash_attention(q, k[:, :, :0], v[:, :, :0])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("seq", [256, 200])
def test_every_admitted_tpu_config_of_flash_attention_lowers(seq, dtype):
    args = [S((1, 2, seq, 64), dtype)] * 3

    def effective(c):
        return min(c["block_q"], seq), min(c["block_k"], seq)

    for causal in (False, True):
        assert tpu_configs_lower(flash_attention, args, {"causal": causal}, effective) >= 1


def test_cli_tunes_causal_flash_attention(cli):
    shape = "1x2x50x16,1x2x50x16,1x2x50x16"
    tune = ["tune", "flash_attention", "--shape", shape]
    static = ["--static", "causal=true", "--static", "sm_scale=0.25"]
    proc = cli([*tune, *static, "--trials", "2", "--no-isolate"])
    assert proc.stdout.count("trial ") == 2 and "rejected 0" in proc.stdout
    out = cli(["db", "list", "--format", "json"])
    (row,) = json.loads(out.stdout)
    assert row["kernel"] == "flash_attention"
    # precision None: the inputs' own (float32: "highest"; see kernels/precision.py)
    assert json.loads(row["static"]) == {"causal": True, "sm_scale": 0.25, "precision": None}
