"""`autotune check`: does every candidate of a kernel's space lower for a TPU or a GPU? With
`--registers`, each Triton candidate's registers and spills too (autotune.measure.registers)."""

from __future__ import annotations

import argparse
from typing import Any

from autotune import backends
from autotune.cli.common import UsageError, add_import_argument, import_user_modules, parse_static
from autotune.cli.output import table
from autotune.measure.lowering import LOWERING_TARGETS
from autotune.trial import config_text
from autotune.tuning.task import check_call, make_task


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "check",
        help="does every candidate of a kernel's space lower for TPU or for a GPU (Triton or "
        "Mosaic GPU)? (no device needed)",
    )
    c.add_argument("kernel", help="a registered kernel name, or package.module:function")
    c.add_argument("--platform", choices=sorted(LOWERING_TARGETS), default="tpu")
    c.add_argument("--shape", required=True, help="argument shapes, e.g. 256x256,256x256")
    c.add_argument(
        "--dtype", default="float32", help="dtype of every argument, or one per argument"
    )
    c.add_argument("--static", action="append", default=[], metavar="NAME=VALUE")
    c.add_argument(
        "--device-kind",
        default=None,
        help="the device whose limits the constraints apply: a TPU generation (v4, v5e, v5p, "
        "v6e, v7x) or jax's device_kind",
    )
    c.add_argument(
        "--sample", type=int, default=None, help="check N candidates spread over the space"
    )
    c.add_argument(
        "--registers",
        nargs="?",
        const="",
        default=None,
        metavar="ARCH",
        help="with --platform gpu: compile each Triton candidate that lowers (pip triton, the "
        "`registers` extra) and report its registers and spill bytes by ptxas, for ARCH (sm_80, "
        "sm_90; default: the device kind's); a candidate the constraints accept that spills "
        "fails the check",
    )
    add_import_argument(c)
    c.set_defaults(run=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from autotune.measure.lowering import check_space
    from autotune.registry import resolve

    import_user_modules(args)
    kernel = resolve(args.kernel)
    task = make_task(args.kernel, args.shape, args.dtype, parse_static(args.static))
    inputs, static = task.inputs(), task.static_dict
    check_call(kernel, inputs, static, args.shape)
    backend = backends.of_platform(args.platform)
    kind = args.device_kind or backend.default_kind
    unknown = backend.unknown_kind(kind)
    if unknown:
        raise UsageError(f"--device-kind {kind!r}: {unknown}")
    if args.sample is not None and args.sample < 1:
        raise UsageError(f"--sample {args.sample}: give a positive number of candidates")
    arch = _register_arch(args, kind)
    rows = check_space(kernel, inputs, static, args.platform, kind, args.sample)
    usage = {}
    if arch is not None:
        from autotune.measure.registers import candidate_usage

        for i, r in enumerate(rows):
            if r.lowering_error is None:
                try:
                    usage[i] = candidate_usage(kernel, r.config, inputs, static, kind, arch)
                except Exception as e:  # not a Triton kernel, or Triton refuses it
                    usage[i] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    out = []
    for i, r in enumerate(rows):
        row = {
            "config": config_text(r.config),
            "constraints": "accept" if r.accepted else "refuse: " + ", ".join(r.violations),
            f"lowers for {args.platform}": "yes"
            if r.lowering_error is None
            else r.lowering_error[:100],
        }
        if arch is not None:
            u = usage.get(i)
            row["registers"] = u.registers if hasattr(u, "registers") else (u or "-")
            row["spill bytes (stores/loads)"] = (
                f"{u.spill_stores}/{u.spill_loads}" if hasattr(u, "spills") else "-"
            )
            row["shared bytes"] = u.shared_bytes if hasattr(u, "shared_bytes") else "-"
        out.append(row)
    print(table(out))
    bad = [r for r in rows if r.accepted and r.lowering_error is not None]
    n_ok = sum(r.accepted for r in rows)
    summary = (
        f"\n{kernel.spec.name} {','.join(args.shape.split(','))} on {kind}: {len(rows)} candidates, "
        f"{n_ok} accepted by the constraints, {len(bad)} of those do not lower"
    )
    spilling = [i for i, u in usage.items() if rows[i].accepted and getattr(u, "spills", False)]
    if arch is not None:
        pruned_fit = [
            i
            for i, u in usage.items()
            if not rows[i].accepted and getattr(u, "spills", True) is False
        ]
        summary += (
            f"; sm_{arch}: {len(spilling)} accepted spill registers, {len(pruned_fit)} refused "
            "spill none (refused for registers or shared memory: see the constraints column)"
        )
    print(summary)
    return 1 if bad or spilling else 0


def _register_arch(args: argparse.Namespace, kind: str) -> int | None:
    """The compute capability `--registers` compiles for (None: not asked); a one-line
    UsageError where it cannot be done here."""
    if args.registers is None:
        return None
    if args.platform != "gpu":
        raise UsageError("--registers compiles Triton candidates: give --platform gpu too")
    from autotune.measure.registers import arch_of, unavailable

    why = unavailable()
    if why:
        raise UsageError(f"--registers: {why}")
    try:
        return arch_of(args.registers or kind)
    except ValueError as e:
        raise UsageError(f"--registers: {e}") from None
