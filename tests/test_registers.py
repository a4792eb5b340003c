"""Registers and spills of Triton candidates, compiled on this CPU-only host by pip's triton and
its ptxas (the `registers` extra): the check `autotune check --registers` makes, and what the
GPU spaces' register models are calibrated against (benchmarks/register_check.py).

Without the extra these tests skip, unless PALLAS_AUTOTUNE_REQUIRE_TRITON=1 (CI sets it): then
they fail."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

from autotune.measure import registers

BF16 = jnp.bfloat16
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def triton_here():
    why = registers.unavailable()
    if why:
        if os.environ.get("PALLAS_AUTOTUNE_REQUIRE_TRITON") == "1":
            pytest.fail(f"{why}, and PALLAS_AUTOTUNE_REQUIRE_TRITON=1")
        pytest.skip(why)


def test_ptxas_reports_are_read_for_registers_and_spills():
    report = """ptxas info    : Compiling entry function 'tile_kernel' for 'sm_90a'
ptxas info    : Function properties for tile_kernel
    416 bytes stack frame, 584 bytes spill stores, 580 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 416 bytes cumulative stack size"""
    usage = registers.parse_ptxas(report, 131072)
    assert usage == registers.Usage(255, 584, 580, 131072) and usage.spills
    clean = "ptxas info    : Used 157 registers, used 1 barriers\n    0 bytes spill stores, 0 bytes spill loads"
    assert not registers.parse_ptxas(clean).spills
    with pytest.raises(RuntimeError, match="no register count"):
        registers.parse_ptxas("ptxas fatal   : Unsupported .version 9.4")
    assert registers.arch_of("sm_80") == 80 and registers.arch_of(H100) == 90
    with pytest.raises(ValueError, match="unknown GPU 'NVIDIA B9'"):
        registers.arch_of("NVIDIA B9")


def test_the_matmul_defaults_old_and_new_compiled_for_an_h100(triton_here):
    # the matmul default before: 128 x 128 x 128, 2 stages, 4 warps, spills (the 4096^3 case:
    # its output tile's 128 x 128 addresses do not fit beside the accumulator); the GPU default
    # now, the same tile on 8 warps with 64-deep K steps, spills nothing
    from autotune.kernels import matmul

    x = jax.ShapeDtypeStruct((256, 256), BF16)
    old = {"block_m": 128, "block_n": 128, "block_k": 128, "num_warps": 4, "num_stages": 2}
    spilled = registers.candidate_usage(matmul, {**old, "group_m": 1}, [x, x], {}, H100)
    assert spilled.registers == 255 and spilled.spills
    assert spilled.shared_bytes == 2 * (128 * 128 + 128 * 128) * 2  # the constraints' model
    sig = matmul.spec.signature([x, x], {}, _device(H100))
    default = matmul.spec.default_config(sig)
    usage = registers.candidate_usage(matmul, default, [x, x], {}, H100)
    assert not usage.spills and usage.registers < 255, (default, usage)


def test_check_reports_registers_and_spills_of_each_candidate(triton_here, capsys):
    from autotune.cli import main

    code = main(
        [
            "check",
            "matmul",
            "--platform",
            "gpu",
            "--shape",
            "64x64,64x64",
            "--dtype",
            "bfloat16",
            "--sample",
            "1",
            "--registers",
            "sm_80",
        ]  # fmt: skip
    )
    out = capsys.readouterr().out
    assert "registers" in out and "spill bytes (stores/loads)" in out
    assert "sm_80: 0 accepted spill registers" in out and code == 0


def test_registers_on_tpu_is_one_line_and_exit_2(capsys):
    from autotune.cli import main

    code = main(
        ["check", "matmul", "--platform", "tpu", "--shape", "256x256,256x256", "--registers"]
    )
    assert code == 2
    assert "--registers compiles Triton candidates: give --platform gpu" in capsys.readouterr().err


def _device(kind):
    from autotune.device import DeviceInfo

    return DeviceInfo("gpu", kind, "triton", "", "", "")


@pytest.mark.parametrize(
    "name, shapes, static",
    [
        # the defaults the issue found spilling: dkv's (64 x 128 on 8 warps: 4.6 KB at head_dim
        # 128) and softmax's (64 rows, clamped to 8, of 4096 float32 on 4 warps: 1.6 KB)
        ("flash_attention_dkv", [(1, 2, 256, 128)] * 4 + [(1, 2, 256)] * 2, {"causal": True}),
        ("softmax", [(8, 4096)], {}),
        ("layer_norm_bwd", [(8, 4096), (4096,), (8, 4096)], {}),  # 64 rows, 4 warps: 30 KB
    ],
)
def test_a_shipped_gpu_default_spills_nothing(triton_here, name, shapes, static):
    from autotune import registry

    kernel = registry.resolve(name)
    dtypes = [BF16] * 4 + [jnp.float32] * 2 if name.startswith("flash") else [jnp.float32] * 3
    args = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes)]
    default = kernel.spec.default_config(kernel.spec.signature(args, static, _device(H100)))
    usage = registers.candidate_usage(kernel, default, args, static, H100)
    assert not usage.spills, (default, usage)
