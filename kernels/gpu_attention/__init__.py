"""gpu_attention: JAX's own Triton attention kernels, called unedited, their block sizes tuned:
`triton_attention` (JAX's `attention.mha`, forward and backward: triton_attention.py) and
`decode_attention` (JAX's `decode_attention.gqa`: decode.py).

JAX 0.12 removed its Triton ops with the Pallas Triton backend's deprecation (Mosaic GPU is
JAX's path on Hopper and newer): under such a JAX these kernels are not registered, and
`autotune kernels` does not list them.
"""

import importlib.util

# the ops' own modules, which JAX 0.12 no longer ships
JAX_HAS_THEM = all(
    importlib.util.find_spec(f"jax.experimental.pallas.ops.gpu.{m}") is not None
    for m in ("attention", "decode_attention")
)

__all__: list[str] = []
if JAX_HAS_THEM:
    from autotune.kernels.gpu_attention.decode import (
        decode_attention,
        decode_attention_reference,
    )
    from autotune.kernels.gpu_attention.triton_attention import (
        triton_attention,
        triton_attention_bwd,
        triton_attention_bwd_reference,
    )

    __all__ += [
        "decode_attention",
        "decode_attention_reference",
        "triton_attention",
        "triton_attention_bwd",
        "triton_attention_bwd_reference",
    ]
