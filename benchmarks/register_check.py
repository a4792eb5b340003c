"""The GPU spaces' register and shared-memory constraints against Triton's own compile, on a
host without a GPU: a confusion table per kernel.

    python benchmarks/register_check.py [--kernels flash_attention,matmul] [--arch sm_90]
        [--device-kind "NVIDIA H100 80GB HBM3"] [--cache FILE.jsonl]

Needs the `registers` extra (pip triton, with its ptxas). For each kernel, at a realistic call
(`CALLS`: the hardware check's shapes, the row kernels and their backward at 8x4096 float32),
every candidate of
`GRIDS` (the GPU space, its pipeline stages fixed where they do not change what a thread holds)
is compiled (autotune.measure.registers) and judged: it fits where ptxas spills nothing and its
shared memory is within the GPU's. The table counts the candidates the space's constraints
accept and prune against that verdict: accepted-but-spills are candidates a search would time
for nothing, pruned-but-fits are candidates it never sees. `--cache` keeps each compile's
figures (a line of JSON per candidate), so that a second run, after a model changed, only
judges. The kernel's default configuration for the call is compiled and listed too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

F32, BF16 = "float32", "bfloat16"
ATTN = [(4, 16, 2048, 128)] * 3
ATTN_BWD = [(4, 16, 2048, 128)] * 4
ROWS = (8, 4096)
# kernel -> (argument shapes and dtypes, static arguments)
CALLS: dict[str, tuple[list[tuple[tuple[int, ...], str]], dict[str, Any]]] = {
    "matmul": ([((4096, 4096), BF16)] * 2, {}),
    "flash_attention": ([(s, BF16) for s in ATTN], {"causal": True}),
    "flash_attention_dq": (
        [(s, BF16) for s in ATTN_BWD] + [((4, 16, 2048), F32)] * 2,
        {"causal": True},
    ),
    "flash_attention_dkv": (
        [(s, BF16) for s in ATTN_BWD] + [((4, 16, 2048), F32)] * 2,
        {"causal": True},
    ),
    "softmax": ([(ROWS, F32)], {}),
    "rms_norm": ([(ROWS, F32), ((4096,), F32)], {}),
    "layer_norm": ([(ROWS, F32), ((4096,), F32), ((4096,), F32)], {}),
    "softmax_bwd": ([(ROWS, F32)] * 2, {}),
    "rms_norm_bwd": ([(ROWS, F32), ((4096,), F32), (ROWS, F32)], {}),
    "layer_norm_bwd": ([(ROWS, F32), ((4096,), F32), (ROWS, F32)], {}),
}
FLASH = {"block_q": [16, 32, 64, 128], "block_k": [16, 32, 64, 128], "num_warps": [4, 8]}
ROW = {"block_rows": [1, 2, 4, 8, 16, 32, 64], "num_warps": [1, 2, 4, 8, 16]}
# the backward's: 8 rows are all there are at 8 x 4096, and 1 warp spills kilobytes (ptxas
# takes minutes over each)
ROW_BWD = {"block_rows": [1, 2, 4, 8], "num_warps": [2, 4, 8, 16]}
# the candidates compiled: the GPU spaces (search_spaces/*.toml) with pipeline stages and the
# matmul's tile order fixed (they move a few registers, not the verdict: see the README)
GRIDS: dict[str, dict[str, list[Any]]] = {
    "matmul": {
        "block_m": [32, 64, 128, 256],
        "block_n": [32, 64, 128, 256],
        "block_k": [32, 64, 128],
        "num_warps": [4, 8],
        "num_stages": [3],
        "group_m": [1],
    },
    "flash_attention": {**FLASH, "num_stages": [2]},
    "flash_attention_dq": {**FLASH, "num_stages": [2]},
    "flash_attention_dkv": {**FLASH, "num_stages": [2]},
    "softmax": ROW,
    "rms_norm": ROW,
    "layer_norm": ROW,
    "softmax_bwd": ROW_BWD,
    "rms_norm_bwd": ROW_BWD,
    "layer_norm_bwd": ROW_BWD,
}


def candidates(kernel: str) -> list[dict[str, Any]]:
    grid = GRIDS[kernel]
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def judge(kernel: str, device_kind: str, arch: int, cache: dict[str, dict]) -> list[dict]:
    """Each candidate's compiled figures (from `cache` where there) and the space's verdict."""
    import jax

    from autotune import registry
    from autotune.backends.hardware import gpu_smem_bytes
    from autotune.device import DeviceInfo
    from autotune.measure.registers import candidate_usage

    spec = registry.resolve(kernel).spec
    shapes, static = CALLS[kernel]
    args = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    sig = spec.signature(args, static, DeviceInfo("gpu", device_kind, "triton", "", "", ""))
    space = spec.space("gpu")
    default = spec.default_config(sig)
    rows = []
    configs = candidates(kernel)
    if default not in configs:
        configs.append(default)
    for config in configs:
        key = json.dumps([kernel, arch, config], sort_keys=True)
        if key not in cache:
            try:
                u = candidate_usage(spec_kernel(kernel), config, args, static, device_kind, arch)
                cache[key] = {"registers": u.registers, "spill_stores": u.spill_stores,
                              "spill_loads": u.spill_loads, "shared": u.shared_bytes}  # fmt: skip
            except Exception as e:  # a candidate Triton or the lowering refuses
                cache[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        figures = cache[key]
        fits = "error" not in figures and (
            figures["spill_stores"] + figures["spill_loads"] == 0
            and figures["shared"] <= gpu_smem_bytes(device_kind)
        )
        rows.append(
            {
                "config": config,
                **figures,
                "fits": fits,
                "accepted": space.is_valid(config, sig),
                "default": config == default,
            }
        )
    return rows


def spec_kernel(name: str) -> Any:
    from autotune import registry

    return registry.resolve(name)


def confusion(rows: list[dict]) -> dict[str, int]:
    judged = [r for r in rows if "error" not in r]
    return {
        "accepted, fits": sum(r["accepted"] and r["fits"] for r in judged),
        "accepted, spills": sum(r["accepted"] and not r["fits"] for r in judged),
        "pruned, fits": sum(not r["accepted"] and r["fits"] for r in judged),
        "pruned, spills": sum(not r["accepted"] and not r["fits"] for r in judged),
        "not compiled": len(rows) - len(judged),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default=",".join(CALLS), help="comma-separated (default: all)")
    p.add_argument("--arch", default="sm_90", help="sm_80, sm_90, ...")
    p.add_argument("--device-kind", default="NVIDIA H100 80GB HBM3")
    p.add_argument("--cache", help="a JSON-lines file of compiled figures, read and extended")
    args = p.parse_args(argv)
    import autotune.kernels  # noqa: F401  (registers the shipped kernels)
    from autotune.measure.registers import arch_of, unavailable

    why = unavailable()
    if why:
        print(f"cannot compile Triton here: {why}", file=sys.stderr)
        return 2
    kernels = args.kernels.split(",")
    unknown = sorted(set(kernels) - set(CALLS))
    if unknown:
        print(f"--kernels: unknown {', '.join(unknown)}: use {', '.join(CALLS)}", file=sys.stderr)
        return 2
    arch = arch_of(args.arch)
    cache: dict[str, dict] = {}
    path = Path(args.cache) if args.cache else None
    if path and path.exists():
        for line in path.read_text().splitlines():
            key, figures = json.loads(line)
            cache[key] = figures
    print(f"GPU {args.device_kind}, sm_{arch}")
    print("| kernel | accepted, fits | accepted, spills | pruned, fits | pruned, spills "
          "| not compiled | default | its registers, spills |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for kernel in kernels:
        start = time.perf_counter()
        rows = judge(kernel, args.device_kind, arch, cache)
        if path:
            path.write_text("".join(json.dumps([k, v]) + "\n" for k, v in cache.items()))
        c = confusion(rows)
        (d,) = [r for r in rows if r["default"]]
        spill = (
            "error"
            if "error" in d
            else f"{d['registers']}, {d['spill_stores']}/{d['spill_loads']} B"
        )
        print(f"| {kernel} | " + " | ".join(str(v) for v in c.values())
              + f" | {d['config']} | {spill} |", flush=True)  # fmt: skip
        for r in rows:
            if "error" not in r and r["accepted"] != r["fits"]:
                print(f"    {'accepted, spills' if r['accepted'] else 'pruned, fits'}: "
                      f"{r['config']} {r['registers']} regs, {r['spill_stores']}/"
                      f"{r['spill_loads']} B spilled, {r['shared']} B shared", file=sys.stderr)  # fmt: skip
        print(f"    ({len(rows)} candidates, {time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
