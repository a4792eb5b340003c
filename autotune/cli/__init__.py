"""The `autotune` command: tune kernels, check and list them, query the tuning database, report.

One module per command group (tune, check, kernels, db, report); each adds its parser and sets
the function that runs it. Bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from autotune.cli import calls, check, db, kernels, report, tune
from autotune.cli.common import Parser
from autotune.errors import AutotuneError


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="autotune", description="Autotune block sizes of JAX Pallas kernels.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (tune, check, kernels, calls, db, report):
        group.add_parser(sub)
    return p


def _terminated(signum: int, frame: object) -> None:
    # SIGTERM ends the run as Ctrl-C does: what was measured and stored is counted first
    raise SystemExit(128 + signum)


def _no_interrupt_traceback(record: logging.LogRecord) -> bool:
    # SQLAlchemy's pool logs a Ctrl-C that lands while it resets a connection, with a
    # traceback, before re-raising it; the re-raised interrupt ends the run with one line below
    return not (record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt))


def main(argv: Sequence[str] | None = None) -> int:
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, _terminated)
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
        )
        for handler in logging.getLogger().handlers:
            if _no_interrupt_traceback not in handler.filters:
                handler.addFilter(_no_interrupt_traceback)
        return args.run(args)
    except AutotuneError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130
