"""gpu_attention: JAX's GPU attention kernels, tuned unedited: its Triton attention, forward and
backward (triton_attention.py), its decode attention and paged attention (decode.py).

JAX 0.12 removed these Triton ops with the Pallas Triton backend's deprecation (Mosaic GPU is
JAX's path on Hopper and newer): under such a JAX they are not registered, and `autotune
kernels` does not list them.
"""

import importlib.util

# the ops' own modules, which JAX 0.12 no longer ships
JAX_HAS_THEM = all(
    importlib.util.find_spec(f"jax.experimental.pallas.ops.gpu.{m}") is not None
    for m in ("attention", "decode_attention", "paged_attention")
)

__all__: list[str] = []
if JAX_HAS_THEM:
    from autotune.kernels.gpu_attention.decode import (
        decode_attention,
        decode_attention_reference,
        paged_attention_gpu,
        paged_attention_gpu_reference,
    )
    from autotune.kernels.gpu_attention.triton_attention import (
        attention_bwd_reference,
        triton_attention,
        triton_attention_bwd,
    )

    __all__ += [
        "attention_bwd_reference",
        "decode_attention",
        "decode_attention_reference",
        "paged_attention_gpu",
        "paged_attention_gpu_reference",
        "triton_attention",
        "triton_attention_bwd",
    ]
