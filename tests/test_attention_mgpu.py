"""attention_mgpu, JAX's Mosaic GPU attention tuned as a member of attention_variants: its
shared-memory model and shape rules against Mosaic GPU's own lowering for "cuda" on this
CPU-only host.

JAX's kernel asks the CUDA runtime for its version when it is traced (it refuses causal
attention on CUDA 12.8 to 12.9.0); with no CUDA here that answer is stubbed (a mock: no CUDA
runtime can run on this host), and nothing else is. Its output is not checked here: GPU
interpret mode cannot run it in jax 0.10.2 ("Higher-order primitive run_state"), and jax
0.10.2's kernel keeps its shared buffers in float16, so float16 is what lowers here (a bf16
call lowers to a wgmma refusal of mixed dtypes)."""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import pytest

from autotune.device import DeviceInfo
from autotune.kernels import attention_mgpu
from autotune.measure.lowering import lowering_error

pytest.importorskip("absl", reason="Mosaic GPU imports absl: pip install absl-py")
module = sys.modules["autotune.kernels.attention_mgpu.attention_mgpu"]
H100 = DeviceInfo("gpu", "NVIDIA H100 80GB HBM3", "mosaic_gpu", jax.__version__, "", "")
LIMIT = 232_448
S = jax.ShapeDtypeStruct


@pytest.fixture
def cuda_13(monkeypatch):
    from jax.experimental.pallas.ops.gpu import attention_mgpu as jax_attention

    monkeypatch.setattr(
        jax_attention,
        "cuda_versions",
        types.SimpleNamespace(cuda_runtime_get_version=lambda: 13000),
    )


def _args(b=2, h=4, s=2048, d=128, dtype=jnp.float16):
    return [S((b, h, s, d), dtype)] * 3


def _config(block_q, block_kv, steps):
    return {"block_q": block_q, "block_kv": block_kv, "max_concurrent_steps": steps}


@pytest.mark.parametrize(
    "config, fits",
    [
        (_config(64, 128, 2), True),
        (_config(128, 128, 2), True),
        (_config(128, 128, 3), False),  # 264,312 bytes
        (_config(64, 256, 2), False),  # 297,048
        (_config(64, 256, 4), False),  # 559,256
    ],
)
def test_shared_memory_model_reproduces_mosaic_gpus_own_count(cuda_13, config, fits):
    args = _args()
    model = module.smem_bytes(config, head_dim=128, seq_k=2048)
    error = lowering_error(attention_mgpu, config, args, {"causal": True}, platform="gpu")
    if fits:
        assert error is None and model <= LIMIT
    else:
        assert f"smem_bytes={model} > max_smem_bytes={LIMIT}" in error
    sig = attention_mgpu.spec.signature(args, {"causal": True}, H100)
    assert attention_mgpu.spec.space("gpu").is_valid(config, sig) == fits


def test_the_pipeline_is_no_deeper_than_the_key_loop(cuda_13):
    # 256 keys in 128-blocks: two steps whatever max_concurrent_steps says, as JAX takes it
    config = _config(64, 128, 4)
    args = [S((1, 2, 256, 64), jnp.float16)] * 3
    model = module.smem_bytes(config, head_dim=64, seq_k=256)
    assert model == module.smem_bytes(_config(64, 128, 2), head_dim=64, seq_k=256)
    assert lowering_error(attention_mgpu, config, args, platform="gpu") is None


def test_the_shape_rules_are_the_kernels_own():
    def valid(config, shape=(2, 4, 2048, 128), dtype="bfloat16"):
        sig = attention_mgpu.spec.signature([S(shape, dtype)] * 3, {}, H100)
        return attention_mgpu.spec.space("gpu").is_valid(config, sig)

    assert valid(_config(64, 128, 2))
    assert not valid(_config(64, 128, 2), dtype="float32")  # 16-bit inputs only
    assert not valid(_config(64, 128, 2), shape=(2, 4, 2048, 96))  # D a multiple of 64
    assert not valid(_config(128, 128, 2), shape=(2, 4, 384, 128))  # Sq of 2 x 128 rows
    assert not valid(_config(64, 256, 2), shape=(2, 4, 384, 128))  # Sk of 256 keys
    assert not valid(_config(64, 128, 2), shape=(2, 4, 128, 128))  # a pipeline of one step


def test_the_scale_rounds_q_once_and_exactly_for_a_power_of_two():
    q = jax.random.normal(jax.random.key(0), (4096,), jnp.float32).astype(jnp.bfloat16)
    assert (module.scaled_query(q, 0.125).astype(jnp.float32) == q.astype(jnp.float32) / 8).all()
    scale = 1 / 128**0.5  # the default at head_dim 128
    once = (q.astype(jnp.float32) * scale).astype(jnp.bfloat16)
    assert (module.scaled_query(q, scale) == once).all()
    # `q * scale` in bf16 rounds the scale to bf16 first, then the product: twice
    assert (q * scale != once).any()
    x = jnp.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert (module.heads_as_batch(x)[:, :, 0] == x.reshape(6, 4, 5)).all()  # no transpose
