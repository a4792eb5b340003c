"""The shipped variant groups: every implementation of an op this package can call, the
fastest served (see autotune.variants).

- `matmul_variants`: the Triton/TPU `matmul`, the Mosaic GPU `matmul_mgpu`, XLA's dot.
- `attention_variants`: `flash_attention`, JAX's own Mosaic GPU attention (`attention_mgpu`,
  the FA3-style kernel, called unedited with a fixed configuration), XLA's
  `dot_product_attention` (cuDNN where XLA picks it).

The groups are named `*_variants` because the kernels `matmul` and `flash_attention` keep their
own names (and their entries); a group's entry sits beside them under the group's name. Each
group takes its first member's call signature and layout: x [M, K] @ y [K, N]; attention of
q [B, H, Sq, D] over k, v [B, H, Sk, D]. Members of another layout are wrapped here.
"""

from __future__ import annotations

import importlib.util
import math

import jax
import jax.numpy as jnp

from autotune.backends import mosaic_gpu
from autotune.device import DeviceInfo
from autotune.kernels.flash_attention import flash_attention
from autotune.kernels.matmul import matmul, matmul_reference
from autotune.kernels.matmul_mgpu import matmul_mgpu
from autotune.variants import Member, variants

# JAX's Mosaic GPU attention at the configuration its own benchmark starts from
MGPU_ATTENTION_BLOCK_Q = 64
MGPU_ATTENTION_BLOCK_KV = 128
MGPU_ATTENTION_STEPS = 2


def needs_hopper(device: DeviceInfo) -> str | None:
    """Why a Mosaic GPU kernel cannot run on `device`, or None: it needs a Hopper GPU
    (a device worker's device is known by its kind)."""
    return mosaic_gpu.why_not(device.platform, device.device_kind)


def needs_hopper_and_absl(device: DeviceInfo) -> str | None:
    """needs_hopper, and absl-py, which JAX's attention_mgpu module imports."""
    if importlib.util.find_spec("absl") is None:
        return "JAX's attention_mgpu imports absl-py, which is not installed: pip install absl-py"
    return needs_hopper(device)


def mosaic_gpu_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: str = "highest",
) -> jax.Array:
    """JAX's attention_mgpu in this group's layout: it takes [B, S, H, D] and applies no
    softmax scale, so q is scaled and every operand transposed here. `precision` is accepted
    for the group's signature: the kernel takes 16-bit inputs only, which it ignores."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    del precision
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    config = attention_mgpu.TuningConfig(
        block_q=MGPU_ATTENTION_BLOCK_Q,
        block_kv=MGPU_ATTENTION_BLOCK_KV,
        max_concurrent_steps=MGPU_ATTENTION_STEPS,
        causal=causal,
    )
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in ((q * scale).astype(q.dtype), k, v))
    return jnp.swapaxes(attention_mgpu.attention(q, k, v, config), 1, 2)


def xla_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: str = "highest",
) -> jax.Array:
    """jax.nn.dot_product_attention (XLA; cuDNN where it applies) in this group's layout;
    float32 inputs at `precision`."""
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))
    with jax.default_matmul_precision(precision):
        out = jax.nn.dot_product_attention(q, k, v, scale=sm_scale, is_causal=causal)
    return jnp.swapaxes(out, 1, 2)


matmul_variants = variants(
    "matmul_variants",
    [matmul, Member(matmul_mgpu, why_not=needs_hopper), Member(matmul_reference, name="xla")],
)

attention_variants = variants(
    "attention_variants",
    [
        flash_attention,
        Member(mosaic_gpu_attention, name="attention_mgpu", why_not=needs_hopper_and_absl),
        Member(xla_attention, name="xla"),
    ],
)
