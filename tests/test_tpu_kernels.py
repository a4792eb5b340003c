"""The TPU bodies of matmul, bmm and flash_attention, checked without a TPU: their output under
TPU interpret mode against the references, their VMEM models against footprints worked out by
hand, the chip facts, and what the constraints accept at realistic large shapes on each
generation, lowered for a TPU on this CPU host with the dimension semantics they carry; and
every kernel a TPU compiles (the registry's), lowered for one at its example."""

import base64
import functools
import importlib
import json
import math
import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import mlir
from jax._src.lib import tpu as tpu_dialect
from jax.experimental.pallas import tpu as pltpu
from jaxlib.mlir import ir
from jaxlib.mlir.passmanager import PassManager
from kernel_checks import close, lowering_failures, lowers_for, rand, with_examples

from autotune.backends import mosaic_tpu
from autotune.backends.hardware import MiB
from autotune.cli import main
from autotune.device import DeviceInfo
from autotune.kernels import (
    attention_reference,
    bmm,
    bmm_reference,
    flash_attention,
    flash_attention_dkv,
    flash_attention_dq,
    layer_norm,
    matmul,
    matmul_reference,
    rms_norm,
    softmax,
    vector_add,
)
from autotune.measure.lowering import lowering_error

mm_module = importlib.import_module("autotune.kernels.matmul.tiles")
fa_module = importlib.import_module("autotune.kernels.flash_attention.forward")
bwd_module = importlib.import_module("autotune.kernels.flash_attention.reference")
tpu_module = importlib.import_module("autotune.kernels.flash_attention.tpu")

S = jax.ShapeDtypeStruct
GENERATIONS = ("v4", "v5e", "v5p", "v6e", "v7x")


@dataclass(frozen=True)
class LoweredKernel:
    """What a Mosaic kernel in a module lowered for a TPU asks of the compiler."""

    dimension_semantics: tuple[str, ...]  # one per grid axis: "parallel", "arbitrary"
    vmem_limit_bytes: int | None  # None: the chip's default scoped limit
    grid: tuple[int, ...]  # the grid's size along each axis, in its order
    text: str  # the Mosaic module


def lowered_kernels(lowered_text: str) -> list[LoweredKernel]:
    """The Mosaic kernels in the text of a module lowered for a TPU (`jax.jit(f).trace(...)
    .lower(lowering_platforms=("tpu",)).as_text()`), read back from the serialized Mosaic
    module each tpu_custom_call carries (through jax's private MLIR bindings)."""
    found = []
    for escaped in re.findall(r'tpu_custom_call\(.*?backend_config = "(.*?)"', lowered_text):
        config = json.loads(escaped.replace("\\22", '"'))
        ctx = mlir.make_ir_context()
        tpu_dialect.register_dialect(ctx)
        with ctx, ir.Location.unknown():
            ctx.allow_unregistered_dialects = True
            module = ir.Module.parse(base64.b64decode(config["custom_call_config"]["body"]))
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
            text = str(module)
        semantics = re.search(r"dimension_semantics = \[(.*?)\]", text)
        scoped = config.get("scoped_memory_configs") or [{}]
        bounds = re.search(r"iteration_bounds = array<i64: ([\d, ]*)>", text)
        found.append(
            LoweredKernel(
                tuple(re.findall(r"dimension_semantics<(\w+)>", semantics.group(1)))
                if semantics
                else (),
                scoped[0].get("size"),
                tuple(int(n) for n in bounds.group(1).split(",")) if bounds else (),
                text,
            )
        )
    return found


def configured(kernel, **options):
    """The kernel's function with the block sizes among `options` bound, and the rest."""
    tunables = kernel.spec.take_overrides(options)
    return functools.partial(kernel.spec.bound_function(tunables, interpret=False), **options)


def tpu_interpret(kernel, *args, **options):
    """The kernel's TPU body (interpret=False on a CPU host) under TPU interpret mode, where
    uninitialised memory reads as NaN."""
    try:
        with pltpu.force_tpu_interpret_mode():
            return configured(kernel, **options)(*args)
    finally:
        mosaic_tpu.reset_interpret_state()


# ------------------------------------------------------------ TPU interpret mode vs references


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_tpu_matmul_body_matches_the_reference(dtype):
    # 130 x 260 @ 260 x 200 in 128-blocks: padded on every axis, three K steps accumulate
    x, y = rand((130, 260), dtype), rand((260, 200), dtype, seed=1)
    out = tpu_interpret(matmul, x, y, block_m=128, block_n=128, block_k=128)
    close(out, matmul_reference(x, y), dtype)


def test_the_tpu_bmm_body_matches_the_reference():
    x, y = rand((2, 20, 300), jnp.bfloat16), rand((2, 300, 136), jnp.bfloat16, seed=1)
    out = tpu_interpret(bmm, x, y, block_m=128, block_n=128, block_k=256)
    close(out, bmm_reference(x, y), jnp.bfloat16)


@pytest.mark.parametrize(
    "sq, sk, block_q, block_k, causal",
    [
        (300, 300, 128, 256, True),  # key blocks wider than q blocks: the diagonal mid-block
        (300, 300, 256, 128, True),  # q blocks wider: two key blocks skipped for the first
        (200, 333, 128, 128, False),  # padded keys masked out of the softmax
        (200, 333, 128, 128, True),
        (256, 384, 128, 128, False),  # no tile needs a mask
        (384, 256, 128, 128, True),  # more queries than keys: the last rows see every key
    ],
)
def test_the_tpu_flash_attention_body_matches_the_reference(sq, sk, block_q, block_k, causal):
    q = rand((1, 1, sq, 64))
    k, v = rand((1, 1, sk, 64), seed=1), rand((1, 1, sk, 64), seed=2)
    out = tpu_interpret(flash_attention, q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    close(out, attention_reference(q, k, v, causal=causal), jnp.float32)


def test_the_tpu_flash_attention_body_keeps_each_rows_log_sum_exp_for_the_backward():
    q = rand((1, 1, 200, 64))
    k, v = rand((1, 1, 333, 64), seed=1), rand((1, 1, 333, 64), seed=2)
    blocks = fa_module.BlockSizes(block_q=128, block_k=128, num_warps=4, num_stages=2)
    options = dict(sm_scale=None, block_sizes=blocks)
    try:
        with pltpu.force_tpu_interpret_mode():
            out, lse = fa_module.attention_on(
                q, k, v, causal=True, platform="tpu", interpret=False, with_lse=True, **options
            )
    finally:
        mosaic_tpu.reset_interpret_state()
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision="highest") / math.sqrt(64)
    visible = jnp.arange(333)[None, :] <= jnp.arange(200)[:, None]
    close(lse, jax.nn.logsumexp(jnp.where(visible, scores, -jnp.inf), axis=-1), jnp.float32)
    close(out, attention_reference(q, k, v, causal=True), jnp.float32)


def test_the_tpu_flash_attention_body_runs_batches_and_heads_in_the_grids_own_order():
    # batch 2, heads 3: the leading parallel axis has more than one block, the grid its order
    q = rand((2, 3, 130, 64))
    k, v = rand((2, 3, 130, 64), seed=1), rand((2, 3, 130, 64), seed=2)
    out = tpu_interpret(flash_attention, q, k, v, causal=True, block_q=128, block_k=128)
    close(out, attention_reference(q, k, v, causal=True), jnp.float32)


@pytest.mark.parametrize("causal", [False, True])
def test_a_tile_is_masked_exactly_where_a_row_must_not_see_one_of_its_keys(causal):
    from autotune.kernels.flash_attention.tiles import masks_any, tile_needs_mask

    masked = whole = 0
    for block_q, block_k, sq, sk in [
        (128, 256, 300, 300),
        (256, 128, 300, 300),
        (128, 128, 200, 333),
        (128, 128, 256, 384),
    ]:
        n_q, n_k = -(-sq // block_q), -(-sk // block_k)
        rows, cols = np.arange(n_q * block_q)[:, None], np.arange(n_k * block_k)[None, :]
        hidden = (cols >= sk) | (causal & (cols > rows))  # what a row must not see
        for t in range(n_q):
            for u in range(n_k):
                tile = hidden[t * block_q : (t + 1) * block_q, u * block_k : (u + 1) * block_k]
                needs = masks_any(causal, sk, block_k) and bool(
                    tile_needs_mask(t, u, block_q, block_k, causal=causal, seq_k=sk)
                )
                assert needs == tile.any(), (block_q, block_k, sq, sk, t, u)
                masked, whole = masked + needs, whole + (not needs and not tile.all())
    assert masked and whole  # some tiles are masked, and some seen whole go without


@pytest.mark.parametrize("block_q, block_k", [(256, 128), (128, 256), (128, 128)])
def test_a_skipped_causal_key_block_repeats_the_last_fetched_one(block_q, block_k):
    n_q, n_k = 3, 3 * block_q // block_k
    for t in range(n_q):
        last_seen = ((t + 1) * block_q - 1) // block_k  # the q block's last row's key block
        fetched = [int(tpu_module.kv_block_fetched(t, u, block_q, block_k)) for u in range(n_k)]
        assert fetched == [min(u, last_seen) for u in range(n_k)]


@pytest.mark.parametrize("causal, sk", [(False, 333), (True, 333), (False, 256)])
def test_the_tpu_flash_attention_backward_bodies_match_the_references(causal, sk):
    # 200 queries in 128-blocks, 333 keys in 256-blocks: padded on both sides; causal, the
    # second key block (keys 256..332) is past every query: no step computes it, dk, dv zero.
    # 256 keys, not causal: no tile needs a mask
    q, do = rand((1, 1, 200, 64)), rand((1, 1, 200, 64), seed=3)
    k, v = rand((1, 1, sk, 64), seed=1), rand((1, 1, sk, 64), seed=2)
    lse, delta = 3 + rand((1, 1, 200), seed=4, scale=0.1), rand((1, 1, 200), seed=5, scale=0.1)
    args, config = (q, k, v, do, lse, delta), dict(causal=causal, block_q=128, block_k=256)
    dq = tpu_interpret(flash_attention_dq, *args, **config)
    dk, dv = tpu_interpret(flash_attention_dkv, *args, **config)
    close(dq, bwd_module.attention_dq_reference(*args, causal=causal), jnp.float32)
    ref_dk, ref_dv = bwd_module.attention_dkv_reference(*args, causal=causal)
    close(dk, ref_dk, jnp.float32)
    close(dv, ref_dv, jnp.float32)


def test_the_gradient_of_the_tpu_flash_attention_body_is_the_true_one():
    # forward (keeping lse) and backward all in their TPU bodies: jax.vjp of the reference
    q, do = rand((1, 1, 200, 64)), rand((1, 1, 200, 64), seed=3)
    k, v = rand((1, 1, 333, 64), seed=1), rand((1, 1, 333, 64), seed=2)
    attention = configured(flash_attention, causal=True, block_q=128, block_k=256)
    try:
        with pltpu.force_tpu_interpret_mode():
            grads = jax.vjp(attention, q, k, v)[1](do)
    finally:
        mosaic_tpu.reset_interpret_state()
    want = jax.vjp(functools.partial(attention_reference, causal=True), q, k, v)[1](do)
    for got, ref in zip(grads, want, strict=True):
        close(got, ref, jnp.float32)


@pytest.mark.parametrize("block_q, block_k", [(256, 128), (128, 256), (128, 128)])
def test_a_skipped_causal_q_block_repeats_the_first_visible_one(block_q, block_k):
    n_q = 3
    n_k = n_q * block_q // block_k
    for u in range(n_k):
        first = u * block_k // block_q  # the first q block whose last row sees key u * block_k
        fetched = [int(tpu_module.q_block_fetched(u, t, block_q, block_k, n_q)) for t in range(n_q)]
        assert fetched == [max(t, first) for t in range(n_q)]
    # keys past every query: the index stays within the grid
    assert int(tpu_module.q_block_fetched(5, 0, 128, 128, 2)) == 1


# ------------------------------------------------------------ every kernel, from the registry


@pytest.mark.parametrize("name", [n for n, k in with_examples().items() if lowers_for(k, "tpu")])
def test_every_kernel_lowers_for_a_tpu_at_its_example(name):
    # its default configuration (adapted to the call) and a spread of those its TPU space's
    # constraints admit, lowered through Mosaic TPU on this host
    assert lowering_failures(with_examples()[name], "tpu") == {}


# ------------------------------------------------------------ VMEM models, by hand


def test_the_matmul_vmem_model_counts_buffers_scratch_and_the_f32_product():
    # bf16 512-tiles: x and y tiles 512 KiB each, twice (double-buffered): 2 MiB; the bf16 out
    # tile twice: 1 MiB; the f32 accumulator 1 MiB; the f32 product of a step 1 MiB
    assert mm_module.tpu_vmem(512, 512, 512, 2) == 5 * MiB
    # f32 2048-tiles: 16 MiB tiles x 2 x 2 + 16 x 2 out + 16 accumulator + 16 product
    assert mm_module.tpu_vmem(2048, 2048, 2048, 4) == 128 * MiB


def test_the_flash_attention_vmem_model_counts_buffers_scratch_and_f32_temporaries():
    # bf16, 1024 x 1024 blocks, head_dim 128: q, k, v, out blocks 256 KiB each, twice: 2 MiB;
    # scratch: max and sum on 128 lanes (512 KiB each) and the f32 output sum 512 KiB;
    # temporaries: scores and exponentials 4 MiB each, p @ v 512 KiB; the lse output block on
    # 128 lanes, twice: 1 MiB
    assert tpu_module.tpu_vmem(1024, 1024, 128, 2) == 13 * MiB


def test_the_flash_attention_backward_vmem_models_count_a_step_of_each_tpu_body():
    # bf16, 1024 x 1024 blocks, head_dim 128; blocks of 256 KiB, double-buffered: dq's q, dO,
    # dq, k, v 2.5 MiB, dkv's q, dO, k, v, dk, dv 3 MiB; lse and delta on 128 lanes, twice:
    # 2 MiB; f32 scratch: dq 512 KiB, dk and dv 1 MiB; f32 scores, probabilities, dp, ds 16 MiB,
    # ds @ k 512 KiB (dq), ds^T @ q and p^T @ dO 1 MiB (dkv)
    assert tpu_module.tpu_vmem_dq(1024, 1024, 128, 2) == (2.5 + 2 + 0.5 + 16 + 0.5) * MiB
    assert tpu_module.tpu_vmem_dkv(1024, 1024, 128, 2) == (3 + 2 + 1 + 16 + 1) * MiB


def test_a_softmax_row_fits_while_eight_rows_do_in_the_default_scoped_vmem():
    # f32, 8 rows a block: in and out blocks double-buffered (4 x 4 B) plus three f32
    # temporaries (12 B) per element: 224 B a column, so 16 MiB hold rows of 74,898 at most
    def accepts(width, kind):
        sig = softmax.spec.signature([S((4096, width), jnp.float32)], {}, tpu(kind))
        return softmax.spec.space("tpu").is_valid({"block_rows": 8}, sig)

    assert accepts(74_880, "v4") and not accepts(75_008, "v4")
    assert accepts(75_008, "v6e")  # 32 MiB scoped by default


def test_a_row_gradient_block_counts_x_g_and_dx_double_buffered():
    # bf16 rows of 4096, 128 a block: x, g and dx double-buffered (6 x 1 MiB) plus six f32
    # temporaries (12 MiB) are 18 MiB, past v5e's 16 MiB scoped default; 64 rows take 9 MiB
    from autotune.kernels import softmax_bwd

    def accepts(block_rows):
        sig = softmax_bwd.spec.signature([S((8192, 4096), jnp.bfloat16)] * 2, {}, tpu("v5e"))
        return softmax_bwd.spec.space("tpu").is_valid({"block_rows": block_rows}, sig)

    assert accepts(64) and not accepts(128)


# ------------------------------------------------------------ chip facts


def tpu(kind: str) -> DeviceInfo:
    return DeviceInfo("tpu", kind, "mosaic_tpu", jax.__version__, "", "")


def test_every_generation_is_known_by_name_and_by_jax_device_kind():
    for kind, name in [
        ("TPU v4", "v4"),
        ("TPU v5 lite", "v5e"),
        ("TPU v5", "v5p"),
        ("TPU v6 lite", "v6e"),
        ("TPU7x", "v7x"),
    ]:
        assert mosaic_tpu.chip(kind) == mosaic_tpu.chip(name) == mosaic_tpu.chip(name.upper())
    assert mosaic_tpu.chip("TPU v9") is None
    facts = {c: mosaic_tpu.chip(c) for c in GENERATIONS}
    assert [facts[c].vmem_bytes // MiB for c in GENERATIONS] == [16, 128, 64, 128, 64]
    assert [mosaic_tpu.scoped_vmem_bytes(c) // MiB for c in GENERATIONS] == [16, 16, 16, 32, 32]
    # megacore on v4 and v5p; v7x's two TensorCores are two devices (JAX's tpu_info)
    assert [facts[c].grid_cores for c in GENERATIONS] == [2, 1, 2, 1, 1]
    assert (
        mosaic_tpu.vmem_budget("TPU v5 lite") == 96 * MiB
        and mosaic_tpu.vmem_budget("TPU v9") == 12 * MiB
    )


def test_the_vmem_limit_is_raised_only_past_every_generations_default():
    assert mosaic_tpu.vmem_limit(12 * MiB) is None
    assert mosaic_tpu.vmem_limit(12 * MiB + 1) == 17 * MiB
    for c in GENERATIONS:  # what a kernel within the budget asks for, the chip has
        limit = mosaic_tpu.vmem_limit(mosaic_tpu.vmem_budget(c)) or mosaic_tpu.scoped_vmem_bytes(c)
        assert limit <= mosaic_tpu.chip(c).vmem_bytes


def test_check_takes_a_generation_and_refuses_an_unknown_device_kind(capsys):
    shape = "1x8x32768x128,1x8x32768x128,1x8x32768x128"
    common = ["--platform", "tpu", "--shape", shape, "--dtype", "bfloat16", "--sample", "3"]
    assert main(["check", "flash_attention", *common, "--device-kind", "v4"]) == 0
    assert "on v4: 3 candidates, 3 accepted" in capsys.readouterr().out
    assert main(["check", "flash_attention", *common, "--device-kind", "TPU v9"]) == 2
    assert "--device-kind 'TPU v9': not a TPU this project knows" in capsys.readouterr().err


# ------------------------------------------------------------ large shapes, every generation


def accepted(kernel, args, kwargs, kind):
    sig = kernel.spec.signature(args, kwargs, tpu(kind))
    return kernel.spec.space("tpu").valid_configs(sig)


def lowered(kernel, config, args, kwargs) -> LoweredKernel:
    fn = configured(kernel, **config, **kwargs)
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    (found,) = lowered_kernels(text)
    return found


def largest(configs, *names):
    """The config with the largest block (the product of these sizes), the first on ties."""
    return max(configs, key=lambda c: math.prod(c[n] for n in names))


@pytest.fixture(scope="module")
def lowerings():
    """Each configuration lowered once: lowering does not depend on the generation."""
    memo = {}

    def get(kernel, config, args, kwargs):
        key = (kernel.spec.name, tuple(sorted(config.items())), str(args), str(kwargs))
        if key not in memo:
            memo[key] = lowered(kernel, config, args, kwargs)
        return memo[key]

    return get


@pytest.mark.parametrize("size", [4096, 8192])
def test_large_matmuls_take_512_tiles_or_larger_on_every_generation(size, lowerings):
    args = [S((size, size), jnp.bfloat16)] * 2
    tile512 = {"block_m": 512, "block_n": 512, "block_k": 512}
    assert lowerings(matmul, tile512, args, {}).dimension_semantics[-1] == "arbitrary"
    for kind in GENERATIONS:
        ok = accepted(matmul, args, {}, kind)
        assert tile512 in ok
        big = largest(ok, "block_m", "block_n")
        # v4's 16 MiB of VMEM hold a 512 x 1024 tile at most, the others 1024 x 1024 or more
        assert big["block_m"] * big["block_n"] >= (512 if kind == "v4" else 1024) * 1024
        low = lowerings(matmul, big, args, {})
        assert low.dimension_semantics == ("parallel", "parallel", "arbitrary")
        need = mm_module.tpu_vmem(big["block_m"], big["block_n"], big["block_k"], 2)
        assert low.vmem_limit_bytes == mosaic_tpu.vmem_limit(need)
        assert (low.vmem_limit_bytes or 0) <= mosaic_tpu.chip(kind).vmem_bytes


def test_large_bmm_lowers_with_the_batch_a_parallel_axis(lowerings):
    args = [S((8, 4096, 4096), jnp.bfloat16)] * 2
    config = {"block_m": 512, "block_n": 1024, "block_k": 512}
    for kind in GENERATIONS:
        assert config in accepted(bmm, args, {}, kind)
    low = lowerings(bmm, config, args, {})
    assert low.dimension_semantics == ("parallel", "parallel", "parallel", "arbitrary")


@pytest.mark.parametrize("causal", [False, True])
def test_32k_token_attention_is_accepted_and_lowers_on_every_generation(causal, lowerings):
    args = [S((1, 8, 32768, 128), jnp.bfloat16)] * 3
    kwargs = {"causal": causal}
    for kind in GENERATIONS:
        ok = accepted(flash_attention, args, kwargs, kind)
        assert {"block_q": 512, "block_k": 512} in ok
        big = largest(ok, "block_q", "block_k")
        assert big["block_q"] * big["block_k"] >= 1024 * 1024
        low = lowerings(flash_attention, big, args, kwargs)
        assert low.dimension_semantics == ("parallel", "parallel", "parallel", "arbitrary")
        assert (low.vmem_limit_bytes or 0) <= mosaic_tpu.chip(kind).vmem_bytes
        # batch 1: the 8 heads lead, so that a megacore's two cores share them
        blocks = (32768 // big["block_q"], 32768 // big["block_k"])
        assert low.grid == (8, 1, *blocks)


@pytest.mark.parametrize(
    "kernel, model",
    [(flash_attention_dq, tpu_module.tpu_vmem_dq), (flash_attention_dkv, tpu_module.tpu_vmem_dkv)],
    ids=["dq", "dkv"],
)
def test_32k_token_attention_backward_is_accepted_and_lowers_on_every_generation(
    kernel, model, lowerings
):
    args = [S((1, 8, 32768, 128), jnp.bfloat16)] * 4 + [S((1, 8, 32768), jnp.float32)] * 2
    kwargs = {"causal": True}
    for kind in GENERATIONS:
        ok = accepted(kernel, args, kwargs, kind)
        assert {"block_q": 512, "block_k": 512} in ok
        big = largest(ok, "block_q", "block_k")
        # v4's 16 MiB hold dkv's 512 x 512 blocks at most, the others' larger ones
        assert big["block_q"] * big["block_k"] >= 512 * (512 if kind == "v4" else 1024)
        low = lowerings(kernel, big, args, kwargs)
        assert low.dimension_semantics == ("parallel", "parallel", "parallel", "arbitrary")
        need = model(big["block_q"], big["block_k"], 128, 2)
        assert low.vmem_limit_bytes == mosaic_tpu.vmem_limit(need)
        assert (low.vmem_limit_bytes or 0) <= mosaic_tpu.chip(kind).vmem_bytes


ROW = S((4096, 32768), jnp.bfloat16)
VEC = S((32768,), jnp.bfloat16)
LONG = S((1 << 26,), jnp.bfloat16)


@pytest.mark.parametrize(
    "kernel, args, block",
    [
        (softmax, [ROW], "block_rows"),
        (rms_norm, [ROW, VEC], "block_rows"),
        (layer_norm, [ROW, VEC, VEC], "block_rows"),
        (vector_add, [LONG, LONG], "block"),
    ],
    ids=["softmax", "rms_norm", "layer_norm", "vector_add"],
)
def test_32k_wide_rows_and_long_vectors_are_accepted_and_lower_on_every_generation(
    kernel, args, block
):
    configs = {kind: accepted(kernel, args, {}, kind) for kind in GENERATIONS}
    assert all(configs.values())
    for size in {largest(c, block)[block] for c in configs.values()}:
        assert lowering_error(kernel, {block: size}, args) is None


def test_a_matmul_of_one_row_of_tiles_leads_with_its_columns(lowerings):
    # 128 rows: one row of tiles; a megacore splits the leading axis: the 8 column tiles
    args = [S((128, 4096), jnp.bfloat16), S((4096, 4096), jnp.bfloat16)]
    low = lowerings(matmul, {"block_m": 128, "block_n": 512, "block_k": 512}, args, {})
    assert low.grid == (8, 1, 8)
    assert low.dimension_semantics == ("parallel", "parallel", "arbitrary")


def test_16_bit_inputs_multiply_in_one_native_mxu_pass_and_float32_keeps_highest(lowerings):
    # "highest" on a TPU is a multi-pass float32 emulation (contract_precision<fp32>): exact
    # products of 16-bit inputs gain nothing from it; float32 inputs need it; a call may ask
    tiles = {"block_m": 128, "block_n": 128, "block_k": 128}

    def emulated(kernel, config, args, kwargs):
        return "contract_precision<fp32>" in lowerings(kernel, config, args, kwargs).text

    bf16, f32 = [S((256, 256), jnp.bfloat16)] * 2, [S((256, 256), jnp.float32)] * 2
    assert not emulated(matmul, tiles, bf16, {})
    assert emulated(matmul, tiles, f32, {})
    assert emulated(matmul, tiles, bf16, {"precision": "highest"})
    attention = [S((1, 2, 256, 128), jnp.bfloat16)] * 3
    assert not emulated(flash_attention, {"block_q": 128, "block_k": 128}, attention, {})
    rows = [S((1, 2, 256), jnp.float32)] * 2
    config = {"block_q": 128, "block_k": 128}
    assert not emulated(flash_attention_dkv, config, attention + attention[:1] + rows, {})
