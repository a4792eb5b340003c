"""The shipped variant groups: every implementation of an op this package can call, the
fastest served (see autotune.runtime.variants).

- `matmul_variants`: the Triton/TPU `matmul`, the Mosaic GPU `matmul_mgpu`, XLA's dot.
- `attention_variants`: `flash_attention`, JAX's own Mosaic GPU attention (`attention_mgpu`,
  the FA3-style kernel, its block sizes tuned: kernels/attention_mgpu/), JAX's splash
  attention on a TPU (kernels/splash_attention/), JAX's Triton attention on a GPU
  (kernels/gpu_attention/), cuDNN's fused attention and XLA's own, both through
  `jax.nn.dot_product_attention`.
- `ragged_dot`: the grouped matmul of a mixture-of-experts layer (lhs [m, k], rhs [groups, k,
  n], group sizes int32 [groups]): JAX's megablox `gmm` (TPU, and interpret mode), JAX's
  Hopper `ragged_dot_mgpu`, our Triton `grouped_matmul` (other GPUs) and XLA's
  `jax.lax.ragged_dot`. Its gradient goes through the member chosen: megablox's is a gmm
  (d lhs) and a tgmm (d rhs), each tuned; ragged_dot_mgpu's and grouped_matmul's d lhs is the
  kernel itself (rhs transposed), their d rhs XLA's; XLA's is XLA's.

The groups are named `*_variants` because the kernels `matmul` and `flash_attention` keep their
own names (and their entries); a group's entry sits beside them under the group's name. Each
group takes its first member's call signature and layout: x [M, K] @ y [K, N]; attention of
q [B, H, Sq, D] over k, v [B, H, Sk, D]. Members of another layout are wrapped here: JAX's
attentions take [B, S, H, D], and get each (batch, head) pair as a batch entry of one head
(`heads_as_batch`: a reshape, no transpose).
"""

from __future__ import annotations

import importlib.util

import jax

from autotune.backends import mosaic_gpu
from autotune.device import DeviceInfo
from autotune.kernels import gpu_attention
from autotune.kernels.attention_mgpu.attention_mgpu import attention_mgpu, heads_as_batch
from autotune.kernels.flash_attention.forward import flash_attention
from autotune.kernels.matmul.matmul import matmul, matmul_reference
from autotune.kernels.matmul_mgpu.matmul_mgpu import matmul_mgpu
from autotune.kernels.megablox.megablox import gmm_reference, megablox_gmm
from autotune.kernels.precision import dot_precision
from autotune.kernels.ragged_dot.grouped_matmul import grouped_matmul
from autotune.kernels.ragged_dot.ragged_dot_mgpu import ragged_dot_mgpu
from autotune.kernels.splash_attention.splash_attention import splash_attention
from autotune.runtime.variants import Member, variants

__all__ = ["attention_variants", "matmul_variants", "ragged_dot"]


def needs_hopper(device: DeviceInfo) -> str | None:
    """Why a Mosaic GPU kernel cannot run on `device`, or None: it needs a Hopper GPU
    (a device worker's device is known by its kind)."""
    return mosaic_gpu.why_not(device.platform, device.device_kind)


def needs_hopper_and_absl(device: DeviceInfo) -> str | None:
    """needs_hopper, and absl-py, which JAX's attention_mgpu module imports."""
    if importlib.util.find_spec("absl") is None:
        return "JAX's attention_mgpu imports absl-py, which is not installed: pip install absl-py"
    return needs_hopper(device)


def needs_tpu(device: DeviceInfo) -> str | None:
    """Why a TPU kernel is not served on `device`, or None on a TPU (on a CPU it would run in
    TPU interpret mode, which the group's other members beat at any size)."""
    if device.platform != "tpu":
        return f"a TPU kernel; this call runs on {device.platform}"
    return None


def needs_gpu(device: DeviceInfo) -> str | None:
    """Why a GPU kernel of JAX's is not served on `device`, or None on a GPU (interpret mode
    runs it elsewhere, slower than the group's other members)."""
    if device.platform != "gpu":
        return f"a GPU kernel; this call runs on {device.platform}"
    return None


def not_on_gpu(device: DeviceInfo) -> str | None:
    """Why a TPU kernel cannot run on `device`: a GPU (TPU interpret mode runs it elsewhere,
    so the group's gradient is checked through it on a CPU too)."""
    if device.platform == "gpu":
        return "a TPU kernel; this call runs on a GPU"
    return None


def needs_nvidia_gpu(device: DeviceInfo) -> str | None:
    """Why cuDNN cannot run on `device`, or None on a GPU (what cuDNN refuses there, a dtype
    or a head_dim, JAX refuses when the call is traced: the group's own check)."""
    if device.platform != "gpu":
        return f"cuDNN runs on NVIDIA GPUs; this call runs on {device.platform}"
    return None


def _dot_product_attention(implementation: str):
    """jax.nn.dot_product_attention by one implementation, in this group's layout and
    signature; float32 inputs at `precision` (dot_precision's default: "highest")."""

    def attention(
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        *,
        causal: bool = False,
        sm_scale: float | None = None,
        precision: str | None = None,
    ) -> jax.Array:
        with jax.default_matmul_precision(dot_precision(precision, q.dtype)):
            out = jax.nn.dot_product_attention(
                *map(heads_as_batch, (q, k, v)),
                scale=sm_scale,
                is_causal=causal,
                implementation=implementation,
            )
        return out.reshape(q.shape)

    attention.__name__ = attention.__qualname__ = f"{implementation}_attention"
    return attention


# XLA's own attention (implementation="xla"), and cuDNN's fused one (implementation="cudnn":
# 16-bit inputs; JAX raises where cuDNN cannot run the call). implementation=None would leave
# the choice to JAX, which picks XLA's.
xla_attention = _dot_product_attention("xla")
cudnn_attention = _dot_product_attention("cudnn")

matmul_variants = variants(
    "matmul_variants",
    [matmul, Member(matmul_mgpu, why_not=needs_hopper), Member(matmul_reference, name="xla")],
    tuned="tuned",
)

attention_variants = variants(
    "attention_variants",
    [
        flash_attention,
        Member(attention_mgpu, why_not=needs_hopper_and_absl),
        Member(splash_attention, why_not=needs_tpu),
        *(
            [Member(gpu_attention.triton_attention, why_not=needs_gpu)]
            if gpu_attention.JAX_HAS_THEM  # gone from JAX 0.12 (kernels/gpu_attention/)
            else []
        ),
        Member(cudnn_attention, name="cudnn", why_not=needs_nvidia_gpu),
        Member(xla_attention, name="xla"),
    ],
    tuned="tuned",
)


def xla_ragged_dot(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool = False
) -> jax.Array:
    """XLA's jax.lax.ragged_dot in this group's signature (float32 at full precision)."""
    return gmm_reference(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs)


ragged_dot = variants(
    "ragged_dot",
    [
        Member(megablox_gmm, why_not=not_on_gpu),
        Member(ragged_dot_mgpu, why_not=needs_hopper),
        Member(grouped_matmul, why_not=needs_gpu),
        Member(xla_ragged_dot, name="xla"),
    ],
    tuned="tuned",
)
