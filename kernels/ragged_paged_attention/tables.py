"""JAX's table format for ragged paged attention: the module `autotune db export --format jax
--kernel ragged_paged_attention` writes, shaped as JAX's own
`ragged_paged_attention/tuned_block_sizes.py` (and the copies vLLM's tpu-inference and
sglang-jax keep), so a serving stack drops it in place of the hand-kept one:

    TUNED_BLOCK_SIZES = {
        'TPU v6': {  # JAX's device name: the first two words of device_kind
            (q_dtype, kv_dtype, q_heads_per_blk, kv_heads_per_blk, head_dim, page_size,
             max_num_batched_tokens, max_model_len): (num_kv_pages_per_block,
                                                      num_queries_per_block),
        },
    }

Each key is the one JAX's `get_tuned_block_sizes` looks up for the tuned call: the heads per
block JAX's kernel takes for those heads and dtypes, then JAX's own `simplify_key` (powers of
two, head_dim in whole 128s). Two tuned shapes that simplify to one key keep the faster."""

from __future__ import annotations

import importlib
from typing import Any

from autotune.signature import parse_args

HEADER = '''"""Auto-tuned block sizes for ragged paged attention, measured on the devices named below
and written by `autotune db export --format jax --kernel ragged_paged_attention`."""

# key:
#     - q_dtype_name
#     - kv_dtype_name
#     - num_q_heads_per_blk
#     - num_kv_heads_per_blk
#     - head_dim
#     - page_size
#     - max_num_batched_tokens
#     - max_model_len = page_size * pages_per_seq
# value:
#     - num_kv_pages_per_block
#     - num_queries_per_block
'''


def device_name(device_kind: str) -> str:
    """JAX's name for a TPU in its table ("TPU v5 lite" -> "TPU v5")."""
    return " ".join(device_kind.split()[:2])


def table_key(signature: str) -> tuple:
    """The key JAX's get_tuned_block_sizes looks up for a call of this signature."""
    jax_tables = importlib.import_module(
        "jax.experimental.pallas.ops.tpu.ragged_paged_attention.tuned_block_sizes"
    )
    kernel = importlib.import_module(
        "jax.experimental.pallas.ops.tpu.ragged_paged_attention.kernel"
    )
    q, kv, _, pages, *_ = parse_args(signature)
    tokens, q_heads, head_dim = q.shape
    _, page_size, combined, _ = kv.shape
    heads_q, combined_per_blk = kernel.get_min_heads_per_blk(q_heads, combined, q.dtype, kv.dtype)
    raw = (
        q.dtype,
        kv.dtype,
        heads_q,
        combined_per_blk // 2,
        head_dim,
        page_size,
        tokens,
        pages.shape[1],
    )
    return tuple(jax_tables.simplify_key(raw))


def jax_table(entries: list[dict[str, Any]]) -> str:
    """The module text of TUNED_BLOCK_SIZES for these exported entries (TPU ones only)."""
    best: dict[str, dict[tuple, tuple[float, tuple[int, int]]]] = {}
    for e in entries:
        if e["platform"] != "tpu":
            continue
        key = table_key(e["signature"])
        value = (e["config"]["num_kv_pages_per_block"], e["config"]["num_queries_per_block"])
        device = best.setdefault(device_name(e["device_kind"]), {})
        if key not in device or e["time_s"] < device[key][0]:
            device[key] = (e["time_s"], value)
    lines = [HEADER, "TUNED_BLOCK_SIZES = {"]
    for device in sorted(best):
        lines.append(f"    {device!r}: {{")
        for key in sorted(best[device]):
            lines.append(f"        {key!r}: {best[device][key][1]!r},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"
