"""Triton kernels checked for a GPU on this CPU-only host: jax 0.10.2 lowers Pallas-Triton for
"cuda" without a driver, so the shipped Triton spaces' constraints are tested against that
lowering (as the Mosaic GPU model is), and a kernel picks Triton's compiler parameters from the
platform it is lowered for, not from this host's device. Every kernel a GPU compiles (the
registry's, Triton and Mosaic GPU) is lowered for one at its example."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from kernel_checks import lowering_failures, lowers_for, with_examples

import autotune
from autotune import backends
from autotune.kernels import flash_attention, matmul, softmax, vector_add
from autotune.measure.lowering import check_space, lowering_error

BF16, F32 = jnp.bfloat16, jnp.float32


def _lowered_text(fn, args):
    with backends.lowering_for("gpu"):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_a_shipped_kernel_lowers_through_triton_for_a_gpu_on_this_host():
    x = jax.ShapeDtypeStruct((256, 512), BF16)
    y = jax.ShapeDtypeStruct((512, 384), BF16)
    config = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4}
    fn = matmul.spec.bound_function(config, interpret=False)
    text = _lowered_text(fn, [x, y])
    # Triton IR inside XLA's custom call, with the config's warps: not Mosaic GPU
    assert "xla.gpu.triton" in text and "num_warps = 4" in text
    assert "mosaic_gpu" not in text
    # the host's own device (a CPU) would have given no compiler parameters: Mosaic GPU
    assert backends.recognise(fn, [x, y]) == "triton"


CASES = [  # the shipped Triton spaces, a spread of each (every candidate: `autotune check`)
    (matmul, [(4096, 4096), (4096, 4096)], BF16, {}, 24),
    (matmul, [(1000, 777), (777, 1234)], F32, {}, 12),
    (flash_attention, [(1, 2, 1000, 64)] * 3, BF16, {"causal": True}, 12),
    (softmax, [(100, 3000)], F32, {}, 8),
    (vector_add, [(100_003,), (100_003,)], F32, {}, 6),
]


@pytest.mark.parametrize(
    "kernel, shapes, dtype, static, sample", CASES, ids=lambda v: getattr(v, "__name__", None)
)
def test_every_accepted_triton_candidate_lowers_for_a_gpu(kernel, shapes, dtype, static, sample):
    args = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
    rows = check_space(kernel, args, static, "gpu", "NVIDIA H200", sample)
    accepted = [r for r in rows if r.accepted]
    assert accepted, "the GPU space accepts nothing for this shape"
    assert [(r.config, r.lowering_error) for r in accepted if r.lowering_error] == []


@pytest.mark.parametrize("name", [n for n, k in with_examples().items() if lowers_for(k, "gpu")])
def test_every_kernel_lowers_for_a_gpu_at_its_example(name):
    # its default configuration (adapted to the call) and a spread of those its GPU space's
    # constraints admit, lowered through its backend (Triton, Mosaic GPU) for "cuda"
    assert lowering_failures(with_examples()[name], "gpu") == {}


def test_a_block_breaking_tritons_power_of_two_rule_is_reported():
    @autotune.autotuned(name="unconstrained_triton_rows", space={"block_rows": [8, 12]})
    def rows(x, *, block_rows=8, interpret=False):
        from autotune.backends import kernel_platform, triton

        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // block_rows,),
            in_specs=[pl.BlockSpec((block_rows, x.shape[1]), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((block_rows, x.shape[1]), lambda i: (i, 0)),
            compiler_params=triton.compiler_params(4, None, kernel_platform(interpret)),
            interpret=interpret,
        )(x)

    x = jax.ShapeDtypeStruct((48, 128), F32)
    assert lowering_error(rows, {"block_rows": 8}, [x], platform="gpu") is None
    assert "power of 2" in lowering_error(rows, {"block_rows": 12}, [x], platform="gpu")


def test_a_plain_pallas_call_is_keyed_by_the_backend_jax_lowers_it_through_on_a_gpu():
    # jax 0.10 lowers a pallas_call without compiler parameters through Mosaic GPU (its
    # jax_pallas_use_mosaic_gpu flag on), jax 0.12 through Triton (the flag gone): the key says
    # what this jax does, as its lowering for a GPU shows
    def double(x):
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x)

    text = _lowered_text(double, [jax.ShapeDtypeStruct((128, 128), F32)])
    lowered = "triton" if "xla.gpu.triton" in text else "mosaic_gpu"
    assert backends.key_backend(None, "gpu") == lowered
    assert backends.key_backend("triton", "gpu") == "triton"
    assert backends.key_backend(None, "tpu") == "mosaic_tpu"
    assert backends.key_backend(None, "cpu") == "interpret"


def test_the_backward_kernels_count_the_blocks_each_keeps_and_streams_in_shared_memory():
    from autotune.device import DeviceInfo
    from autotune.kernels import flash_attention_dkv, flash_attention_dq

    h200 = DeviceInfo("gpu", "NVIDIA H200", "triton", "", "", "")  # 232,448 B per block
    qkv = [jax.ShapeDtypeStruct((1, 1, 2048, 128), BF16)] * 4
    rows = [jax.ShapeDtypeStruct((1, 1, 2048), F32)] * 2
    config = {"block_q": 128, "block_k": 16, "num_warps": 8, "num_stages": 4}
    for kernel, fits in ((flash_attention_dq, True), (flash_attention_dkv, False)):
        spec = kernel.spec
        sig = spec.signature(qkv + rows, {}, h200)
        # dq holds q and dO (2 x 128 rows), 4 stages of k and v (8 x 16): 98,304 B;
        # dkv holds k and v (2 x 16), 4 stages of q and dO (8 x 128): 270,336 B (both well
        # within their register models on 8 warps: shared memory decides)
        assert (spec.space("gpu").violations(config, sig) == []) is fits, kernel


def test_the_flash_kernels_keep_their_tiles_within_a_threads_registers():
    # the register models, calibrated against Triton's compile for sm_90 at the hardware
    # check's call (benchmarks/register_check.py; tests/test_registers.py compiles some). At
    # 1024 tokens and D <= 128 every config below fits shared memory: registers decide.
    from autotune.device import DeviceInfo
    from autotune.kernels import flash_attention, flash_attention_dkv, flash_attention_dq

    h100 = DeviceInfo("gpu", "NVIDIA H100 80GB HBM3", "triton", "", "", "")

    def sig(kernel, d):
        args = [jax.ShapeDtypeStruct((1, 2, 1024, d), BF16)] * 3
        if kernel is not flash_attention:
            args += [args[0]] + [jax.ShapeDtypeStruct((1, 2, 1024), F32)] * 2
        return kernel.spec.signature(args, {"causal": True}, h100)

    def fits(kernel, d, num_warps, block_q=128, block_k=128):
        config = {"block_q": block_q, "block_k": block_k, "num_warps": num_warps, "num_stages": 2}
        return kernel.spec.space("gpu").is_valid(config, sig(kernel, d))

    # the forward's output sum, scores and q tile: 128 query rows on 4 warps spill at D 128
    # whatever the key block, and at D 64 with 128 keys (32 B); 64 rows, or 8 warps, do not
    assert not fits(flash_attention, 128, 4, block_k=16) and not fits(flash_attention, 64, 4)
    assert fits(flash_attention, 64, 4, block_k=64) and fits(flash_attention, 128, 4, block_q=64)
    assert fits(flash_attention, 128, 8)
    assert flash_attention.spec.default_config(sig(flash_attention, 128))["num_warps"] == 8
    # dq: its accumulator, probabilities and dp, q and dO: 128 query rows on 4 warps spill
    assert fits(flash_attention_dq, 128, 8) and not fits(flash_attention_dq, 128, 4, block_k=16)
    assert fits(flash_attention_dq, 128, 4, block_q=64)
    # dkv: dk and dv (one warpgroup holds both on 4 warps), probabilities and dp, k and v: 128
    # keys a step spill on 8 warps too; 64 keys on 8 warps do not, and are its GPU default
    assert not fits(flash_attention_dkv, 128, 8, block_q=16)
    assert fits(flash_attention_dkv, 128, 8, 128, 64) and not fits(
        flash_attention_dkv, 128, 4, 16, 64
    )
    assert flash_attention_dkv.spec.default_config(sig(flash_attention_dkv, 128)) == {
        "block_q": 64,
        "block_k": 64,
        "num_warps": 8,
        "num_stages": 2,
    }
