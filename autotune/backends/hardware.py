"""Chip facts that constraints use to rule candidates out before anything compiles: the
tables of the GPUs (shared memory, registers, L2) and the TPU's tiling rule, and the block
arithmetic the kernels share. Nothing here asks which platform or backend a call runs on: that
is `autotune.backends` (which reads these tables), and the TPU's per generation facts are in
`autotune.backends.mosaic_tpu`.

Sources: the vendors' datasheets (see shared PALLAS_FACTS).
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# TPU blocks: the last two dimensions must be divisible by (8, 128), or equal the array's.
TPU_SUBLANES = 8
TPU_LANES = 128
# VMEM per generation is in autotune.backends.mosaic_tpu, with the TPU's other chip facts.

# NVIDIA shared memory per thread block (opt-in maximum), by a device_kind substring.
GPU_SMEM = {
    "H200": 227 * KiB,
    "H100": 227 * KiB,
    "A100": 163 * KiB,
    "L4": 99 * KiB,
    "A10": 99 * KiB,
}
GPU_SMEM_DEFAULT = 99 * KiB  # a conservative figure for GPUs not in the table
GPU_MAX_WARPS = 32  # 1024 threads per block
GPU_WARP = 32
# 32-bit registers: 64 Ki per SM on every generation above, at most 255 per thread.
GPU_REGISTERS_PER_SM = 64 * 1024
GPU_MAX_REGISTERS_PER_THREAD = 255
# Last-level (L2) cache, by a device_kind substring: inputs smaller than this are rotated
# among several copies when timing, so a candidate is not flattered by a warm cache.
GPU_L2 = {
    "H200": 60 * MiB,  # as the driver reports it on an H200 (62,914,560 bytes)
    "H100": 50 * MiB,
    "A100": 40 * MiB,
    "L4": 48 * MiB,
    "A10": 6 * MiB,
}
GPU_L2_DEFAULT = 50 * MiB


# Streaming multiprocessors, by a device_kind substring: what a GPU's abstract device carries
# when kernels are lowered for it on a host without it (autotune.backends.lowering_for).
GPU_SMS = {"H200": 132, "H100": 132, "A100": 108, "L4": 58, "A10": 72}
GPU_SMS_DEFAULT = 132


def gpu_sm_count(device_kind: str) -> int:
    return by_kind(GPU_SMS, device_kind, GPU_SMS_DEFAULT)


def by_kind(table: dict[str, int], device_kind: str, default: int) -> int:
    """The figure of the first name in `table` (more specific names first) that `device_kind`
    contains, else `default`: the one device-kind lookup of the chip tables."""
    return next((value for name, value in table.items() if name in device_kind), default)


def gpu_smem_bytes(device_kind: str) -> int:
    return by_kind(GPU_SMEM, device_kind, GPU_SMEM_DEFAULT)


def gpu_l2_bytes(device_kind: str) -> int:
    return by_kind(GPU_L2, device_kind, GPU_L2_DEFAULT)


# A Triton kernel that keeps several float32 tiles live at once (an accumulator and a score
# tile) gives them at most this many registers a thread: the rest of the 255 go to its operands,
# addresses and indices. JAX's own GPU attention takes 4 warps up to head_dim 64 and 8 past it
# at 128 x 128 blocks: 192 and 128 registers a thread of float32 tiles; 4 warps at head_dim 128
# would need 256 and spill (jax/experimental/pallas/ops/gpu/attention.py).
GPU_TILE_REGISTERS = 192


def gpu_registers_ok(
    accumulator_elems: int,
    num_warps: int,
    bytes_per_elem: int = 4,
    budget: int = GPU_MAX_REGISTERS_PER_THREAD,
) -> bool:
    """Whether a block's live tiles (`accumulator_elems` elements in all) fit in `budget`
    registers of each of its threads (Triton keeps them there; beyond this it must spill)."""
    per_thread = accumulator_elems * bytes_per_elem // 4 / (GPU_WARP * num_warps)
    return per_thread <= budget and num_warps <= GPU_MAX_WARPS


def gpu_thread_register_cap(num_warps: int) -> int:
    """The registers a thread of a block of `num_warps` warps can have: 255, or fewer where the
    block's threads share the SM's 64 Ki (128 at 16 warps)."""
    return min(GPU_MAX_REGISTERS_PER_THREAD, GPU_REGISTERS_PER_SM // (GPU_WARP * num_warps))


def tpu_block_ok(block: tuple[int, ...], array: tuple[int, ...]) -> bool:
    """The TPU rule for a block of a rank >= 2 array: last two dims divisible by (8, 128),
    or equal to the array's dims."""
    if len(block) < 2:
        return tpu_block_1d_ok(block[0], array[0], 32)
    (b0, b1), (a0, a1) = block[-2:], array[-2:]
    return (b0 % TPU_SUBLANES == 0 or b0 == a0) and (b1 % TPU_LANES == 0 or b1 == a1)


def tpu_block_1d_ok(block: int, dim: int, bitwidth: int) -> bool:
    """Rank-1 blocks: equal to the array, a multiple of 1024, or a power of two of at least
    128 * (32 / bitwidth) (JAX's Pallas TPU docs)."""
    if block == dim or block % 1024 == 0:
        return True
    return block & (block - 1) == 0 and block >= TPU_LANES * (32 // bitwidth)


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# Triton keeps a block in registers: its element count is capped (triton's TRITON_MAX_TENSOR_NUMEL).
TRITON_MAX_NUMEL = 1 << 20


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()
