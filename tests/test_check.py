"""Static pre-validation: every TPU candidate the shipped spaces accept lowers for TPU (on CPU)."""

import jax
import jax.numpy as jnp
import pytest
from kernel_checks import tpu_configs_lower
from toy_kernels import _scale_call

import autotune
from autotune.kernels import matmul, vector_add
from autotune.measure.lowering import check_tpu_space

CASES = [
    (vector_add, [(1000,), (1000,)]),
    (vector_add, [(8192,), (8192,)]),
    (vector_add, [(100_003,), (100_003,)]),
    (matmul, [(256, 512), (512, 256)]),
    (matmul, [(100, 300), (300, 200)]),
    (matmul, [(1024, 128), (128, 640)]),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("kernel, shapes", CASES)
def test_every_accepted_tpu_candidate_lowers(kernel, shapes, dtype):
    args = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
    if kernel is matmul:  # blocks clamp to these small dims: lower each distinct layout once
        (m, k), (_, n) = shapes

        def effective(c):
            return min(c["block_m"], m), min(c["block_n"], n), min(c["block_k"], k)

        assert tpu_configs_lower(matmul, args, {}, effective) >= 1
        return
    rows = check_tpu_space(kernel, args)
    accepted = [r for r in rows if r.accepted]
    assert accepted, "the TPU space accepts nothing for this shape"
    failing = [(r.config, r.lowering_error) for r in accepted if r.lowering_error]
    assert not failing


def test_a_block_breaking_the_tiling_rule_is_reported():
    @autotune.autotuned(name="unconstrained_scale", space={"block_rows": [8, 12]})
    def unconstrained_scale(x, *, block_rows=8, interpret=False):
        return _scale_call(x, block_rows, interpret)

    rows = check_tpu_space(unconstrained_scale, [jax.ShapeDtypeStruct((48, 128), jnp.float32)])
    by_block = {r.config["block_rows"]: r for r in rows}
    assert by_block[8].accepted and by_block[8].lowering_error is None
    assert by_block[12].accepted  # no constraint refuses it, and the lowering does
    assert "divisible by 8 and 128" in by_block[12].lowering_error


def test_gpu_constraints_prune_by_shared_memory_and_registers_without_a_gpu():
    from autotune.device import DeviceInfo

    def accepts(kind, **config):
        device = DeviceInfo("gpu", kind, "triton", "", "", "")
        args = [jax.ShapeDtypeStruct((1024, 1024), jnp.float32)] * 2
        sig = matmul.spec.signature(args, {}, device)
        full = {"block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 2}
        return matmul.spec.space("gpu").is_valid(full | config, sig)

    assert accepts("NVIDIA H100 80GB HBM3")
    # the accumulator of a 256x256 tile over 2 warps needs 1024 registers a thread
    assert not accepts("NVIDIA H100 80GB HBM3", block_m=256, block_n=256, num_warps=2)
    assert accepts("NVIDIA H100 80GB HBM3", block_m=128, block_n=128, num_warps=8)
    # 4 stages of 128x128 + 128x128 f32 tiles: 512 KiB of shared memory, more than any GPU has
    big = {"block_m": 128, "block_n": 128, "block_k": 128, "num_stages": 4, "num_warps": 8}
    assert not accepts("NVIDIA H100 80GB HBM3", **big)
    # 3 stages of 64-tiles of K=128: 192 KiB fits an H100's 227 KiB, not an A100's 163 KiB
    mid = {"block_m": 64, "block_n": 64, "block_k": 128, "num_stages": 3, "num_warps": 4}
    assert accepts("NVIDIA H100 80GB HBM3", **mid) and not accepts("NVIDIA A100-SXM4-40GB", **mid)
