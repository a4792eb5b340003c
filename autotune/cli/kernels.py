"""`autotune kernels`: the registered kernels and their tunable parameters on this platform."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.cli.common import add_import_argument, import_user_modules
from autotune.cli.output import table


def add_parser(sub: Any) -> None:
    k = sub.add_parser("kernels", help="list registered kernels and their tunable parameters")
    add_import_argument(k)
    k.set_defaults(run=cmd_kernels)


def cmd_kernels(args: argparse.Namespace) -> int:
    from autotune.device import current_device
    from autotune.registry import registered

    import_user_modules(args)
    platform = current_device().platform
    rows = []
    for name, kernel in registered().items():
        spec = kernel.spec
        space = spec.space(platform)
        params = "; ".join(f"{p.name} in {list(p.values)}" for p in space.params)
        if spec.workloads:  # what --workload chooses among (the first: the default)
            params += f" (workloads: {', '.join(spec.workloads)})"
        rows.append({"kernel": name, "version": spec.version, f"parameters ({platform})": params})
    print(table(rows))
    return 0
