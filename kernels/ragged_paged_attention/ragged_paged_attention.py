"""JAX's ragged paged attention (`jax.experimental.pallas.ops.tpu.ragged_paged_attention`,
vLLM-TPU's and sglang-jax's serving attention), called unedited, with its two block sizes
tuned: `num_kv_pages_per_block` and `num_queries_per_block`, the values JAX's hand-kept
`tuned_block_sizes.py` holds (autotune db export --format jax writes a table of that shape:
tables.py). The VMEM limit is set where the model below says the default scoped one is short.

The arguments are JAX's, in JAX's order; kv_lens, page_indices, cu_q_lens and num_seqs are data
the tuner makes by a workload (workloads.py: decode, prefill, mixed). JAX's kernel does not run
in TPU interpret mode (jax 0.10.2: "'ReshapeTransform' object has no attribute 'indices'"), so
it is judged against its reference on a TPU, and a host that can only interpret it (a CPU)
refuses to tune it; its candidates can still be lowered for a TPU there (`autotune check`).
It has no gradient (JAX's has none): a serving kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib

import jax
import jax.numpy as jnp

from autotune import Example, autotuned, backends
from autotune.backends import mosaic_tpu
from autotune.kernels.ragged_paged_attention.workloads import WORKLOADS
from autotune.registry.varying import unchecked
from autotune.signature import ArgSpec, Signature, dtype_name

# 32 tokens of 4 query heads over 2 kv heads (4 combined) of 128, 16-token pages, 4 sequences
# of up to 8 pages
EXAMPLE = "bf16[32,4,128],bf16[32,16,4,128],s32[4],s32[4,8],s32[5],s32[1]"
PIPELINE_BUFFERS = 2
LM_LANES = 128  # JAX keeps the running max and sum 128 lanes wide (Mosaic's aligned slicing)

WHY_NOT_INTERPRETED = (
    "JAX's ragged paged attention does not run in TPU interpret mode (jax 0.10.2: "
    "'ReshapeTransform' object has no attribute 'indices')"
)


def _jax_rpa():
    return importlib.import_module("jax.experimental.pallas.ops.tpu.ragged_paged_attention.kernel")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """JAX's two tunables: kv pages per flash-attention block, queries per block."""

    num_kv_pages_per_block: int = 8
    num_queries_per_block: int = 32


def vmem_bytes(config: dict, sig) -> int:
    """VMEM of JAX's kernel: the double-buffered kv pages of a block, the q and output blocks
    (pipelined), the float32 accumulator, running max and sum."""
    (_, q_heads, d), (_, page_size, combined, _) = sig.shapes[0], sig.shapes[1]
    q_item, kv_item = (jnp.dtype(t).itemsize for t in sig.dtypes[:2])
    heads_q, heads_kv2 = _jax_rpa().get_min_heads_per_blk(
        q_heads, combined, sig.dtypes[0], sig.dtypes[1]
    )
    nq, pages = config["num_queries_per_block"], config["num_kv_pages_per_block"]
    ratio = q_heads // (combined // 2)
    kv = 2 * pages * page_size * heads_kv2 * d * kv_item
    q_out = PIPELINE_BUFFERS * 2 * nq * heads_q * d * q_item
    lm = 2 * (heads_kv2 // 2) * nq * ratio * LM_LANES * 4
    return kv + q_out + lm + nq * heads_q * d * 4


def fits(config: dict, sig) -> bool:
    """JAX's rule (kv pages per block within a sequence's pages), no query block past the
    step's tokens, and on a TPU the VMEM model within what a raised limit gives."""
    if len(sig.shapes) != 6 or len(sig.shapes[0]) != 3 or len(sig.shapes[3]) != 2:
        return True  # JAX's kernel rejects such calls with its own message
    tokens, pages_per_seq = sig.shapes[0][0], sig.shapes[3][1]
    if not (
        0 < config["num_kv_pages_per_block"] <= pages_per_seq
        and 0 < config["num_queries_per_block"] <= tokens
    ):
        return False
    return sig.platform != "tpu" or vmem_bytes(config, sig) <= mosaic_tpu.vmem_budget(
        sig.device_kind
    )


def _valid_tokens(out: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array) -> jax.Array:
    """`out` with the rows past the step's tokens zero (JAX's kernel leaves them unwritten)."""
    valid = jnp.arange(out.shape[0]) < cu_q_lens[num_seqs[0]]
    return jnp.where(valid[:, None, None], out, jnp.zeros((), out.dtype))


def ragged_paged_attention_reference(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> jax.Array:
    """JAX's reference's arithmetic, jittable (JAX's loops over the sequences in Python): each
    token attends the cached keys of its sequence up to its own position, in float32; the rows
    past the step's tokens 0."""
    tokens, q_heads, d = q.shape
    _, page_size, combined, _ = kv_pages.shape
    kv_heads = combined // 2
    f32 = jnp.float32
    seq = jnp.searchsorted(cu_q_lens[1:], jnp.arange(tokens), side="right")
    seq = jnp.minimum(seq, kv_lens.shape[0] - 1)
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    position = kv_lens[seq] - q_len + (jnp.arange(tokens) - cu_q_lens[seq])
    pages = kv_pages[page_indices[seq]]  # [tokens, pages_per_seq, page_size, combined, d]
    cache = pages.reshape(tokens, -1, combined, d).astype(f32)
    k, v = cache[:, :, 0::2], cache[:, :, 1::2]
    k, v = (jnp.repeat(x, q_heads // kv_heads, axis=2) for x in (k, v))
    s = jnp.einsum("thd,tkhd->thk", q.astype(f32), k, precision="highest") * sm_scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    j = jnp.arange(k.shape[1])[None, :]
    seen = (j <= position[:, None]) & (j < kv_lens[seq][:, None])
    if sliding_window is not None:
        seen &= position[:, None] - sliding_window < j
    s = jnp.where(seen[:, None, :], s, -jnp.inf)
    out = jnp.einsum("thk,tkhd->thd", jax.nn.softmax(s, axis=-1), v, precision="highest")
    return _valid_tokens(out.astype(q.dtype), cu_q_lens, num_seqs)


@autotuned(
    name="ragged_paged_attention",
    space="ragged_paged_attention",
    constraints=[fits],
    reference=ragged_paged_attention_reference,
    backend="mosaic_tpu",
    tuned="../tuned",
    example=Example(EXAMPLE),
    workloads=WORKLOADS,
    not_interpretable=WHY_NOT_INTERPRETED,
)
def ragged_paged_attention(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """JAX's `ragged_paged_attention(q [tokens, q_heads, d], kv_pages [pages, page_size,
    2 * kv_heads, d], kv_lens, page_indices, cu_q_lens, num_seqs)` at the tuned block sizes;
    the rows past the step's tokens 0. `interpret=True` asks TPU interpret mode, which cannot
    run JAX's kernel (see the module docstring)."""
    args = (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    sig = Signature(tuple(ArgSpec(tuple(a.shape), dtype_name(a.dtype)) for a in args))
    kwargs = dict(
        sm_scale=sm_scale,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
        num_kv_pages_per_block=block_sizes.num_kv_pages_per_block,
        num_queries_per_block=block_sizes.num_queries_per_block,
        vmem_limit_bytes=mosaic_tpu.vmem_limit(vmem_bytes(dataclasses.asdict(block_sizes), sig)),
    )
    with _device_for(interpret):
        out = unchecked(_jax_rpa().ragged_paged_attention, *args, **kwargs)
    return _valid_tokens(out, cu_q_lens, num_seqs)


def _device_for(interpret: bool):
    """TPU interpret mode where asked; where a TPU lowering is traced on a host with none (a
    check from a CPU) outside any mesh, a one-device mesh of a TPU for JAX's kernel to ask its
    chip facts of (it reads them while lowering: 'Unsupported TPU device kind: cpu' otherwise);
    else nothing (a shard_map's mesh names its devices)."""
    from jax.experimental.pallas import tpu as pltpu

    if interpret:
        return pltpu.force_tpu_interpret_mode()
    if (
        backends.kernel_platform(False) != "tpu"
        or jax.devices()[0].platform == "tpu"
        or not jax.sharding.get_abstract_mesh().empty
    ):
        return contextlib.nullcontext()
    device = jax.sharding.AbstractDevice(mosaic_tpu.DEFAULT_KIND, 1, "tpu")
    return jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("_tpu",), abstract_device=device)
    )
