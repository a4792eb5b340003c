"""`autotune check`: does every candidate of a kernel's space lower for a TPU or a GPU?"""

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
    rows = check_space(kernel, inputs, static, args.platform, kind, args.sample)
    print(
        table(
            [
                {
                    "config": config_text(r.config),
                    "constraints": "accept" if r.accepted else "refuse: " + ", ".join(r.violations),
                    f"lowers for {args.platform}": "yes"
                    if r.lowering_error is None
                    else r.lowering_error[:100],
                }
                for r in rows
            ]
        )
    )
    bad = [r for r in rows if r.accepted and r.lowering_error is not None]
    n_ok = sum(r.accepted for r in rows)
    print(
        f"\n{kernel.spec.name} {','.join(args.shape.split(','))} on {kind}: {len(rows)} candidates, "
        f"{n_ok} accepted by the constraints, {len(bad)} of those do not lower"
    )
    return 1 if bad else 0
