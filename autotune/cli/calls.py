"""`autotune calls`: the @autotuned calls a program makes, and where each is served from now."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.cli.common import add_import_argument, import_user_modules
from autotune.cli.output import config_text, render, table


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "calls",
        help="list the @autotuned calls of a program (forward and backward), traced, not run",
    )
    c.add_argument(
        "program",
        help="package.module:factory, where factory() returns (fn, args) or (fn, args, kwargs)",
    )
    c.add_argument("--format", choices=("table", "json", "csv"), default="table")
    add_import_argument(c)
    c.set_defaults(run=cmd_calls)


def cmd_calls(args: argparse.Namespace) -> int:
    from autotune.runtime.calls import calls_in, load_program

    import_user_modules(args)
    fn, call_args, kwargs = load_program(args.program)
    rows = [c.as_dict() for c in calls_in(fn, call_args, kwargs)]
    if args.format != "json":  # what a call gathers first, in one cell
        rows = [{**r, "gathered": "; ".join(r["gathered"])} for r in rows]
    if args.format == "table":
        rows = [
            {**r, "config": config_text(r["config"]), "mesh_axes": _axes_text(r["mesh_axes"])}
            for r in rows
        ]
        # a column only where a trace is older, or a call gathers
        shown = {k for k in _RARE if any(r[k] for r in rows)}
        rows = [{k: v for k, v in r.items() if k not in _RARE or k in shown} for r in rows]
        print(table(rows) if rows else "(no @autotuned calls)")
    else:
        print(render(rows, args.format))
    return 0


_RARE = ("detail", "gathered")


def _axes_text(axes: dict[str, int]) -> str:
    """The mesh axes a call is mapped over, as "d=4" ("-" where none)."""
    return ",".join(f"{name}={size}" for name, size in axes.items()) or "-"
