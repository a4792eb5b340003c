"""What the command groups share: the parser class, the usage error, --import, --static."""

from __future__ import annotations

import argparse
import ast
import json
from collections.abc import Sequence
from typing import Any, NoReturn

from autotune.errors import AutotuneError, SignatureError
from autotune.registry import import_modules

DB_HELP = "SQLAlchemy URL or file (default: $PALLAS_AUTOTUNE_DB or the user cache)"


class UsageError(AutotuneError):
    """A command line that cannot be carried out as written."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def add_import_argument(p: Any) -> None:
    """--import MODULE, on a parser or an argument group, for every command that resolves
    kernels: the user's own kernels are registered by importing the module that defines them."""
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module that registers your own kernels (repeatable)",
    )


def import_user_modules(args: argparse.Namespace) -> None:
    import_modules(getattr(args, "imports", ()))


def parse_static(items: Sequence[str]) -> dict[str, Any]:
    """--static causal=true --static sm_scale=0.125: values are JSON (bare words are strings)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise SignatureError(f"malformed --static {item!r}: write name=value, e.g. causal=true")
        out[name] = _static_value(value)
    return out


def _static_value(text: str) -> Any:
    """JSON (true, 0.125, "s"), or a Python literal of a scalar (True, False, None, 1e-3), or
    else the text itself: `causal=False` is False, never the (truthy) string "False"."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if value is None or isinstance(value, (bool, int, float)) else text
