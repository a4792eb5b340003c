"""The `autotune` command: tune kernels, check and list them, query the tuning database, report.

One module per command group (tune, check, kernels, db, report); each adds its parser and sets
the function that runs it. Bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

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


def _terminated(signum: int, frame: Any) -> None:
    # SIGTERM ends the run as Ctrl-C does: what was measured and stored is counted first
    if not _in_gc_callback(signum, frame):
        raise SystemExit(128 + signum)


_deferred: list[int] = []  # a Ctrl-C or SIGTERM that landed in a gc callback, not yet raised


def _interrupted(signum: int, frame: Any) -> None:
    if not _in_gc_callback(signum, frame):
        raise KeyboardInterrupt


def _in_gc_callback(signum: int, frame: Any) -> bool:
    # Ctrl-C, SIGTERM: an exception raised inside a garbage-collector callback (JAX registers
    # one) is swallowed ("Exception ignored in ...") and the run goes on: the signal is
    # delivered again a moment later, outside the callback, or the command ends when it
    # returns, whichever comes first
    if frame is not None and frame.f_code in {getattr(c, "__code__", None) for c in gc.callbacks}:
        _deferred.append(signum)
        threading.Timer(0.01, _redeliver, (signum,)).start()
        return True
    _deferred.clear()
    return False


def _redeliver(signum: int) -> None:
    if _deferred:
        os.kill(os.getpid(), signum)


def _no_interrupt_traceback(record: logging.LogRecord) -> bool:
    # SQLAlchemy's pool logs a Ctrl-C that lands while it resets a connection, with a
    # traceback, before re-raising it; the re-raised interrupt ends the run with one line below
    return not (record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt))


def main(argv: Sequence[str] | None = None) -> int:
    main_thread = threading.current_thread() is threading.main_thread()
    # not if SIGINT is ignored (a background job), nor if the caller handles it
    ours = main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ours_term = main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if ours_term:
        signal.signal(signal.SIGTERM, _terminated)
    if ours:
        signal.signal(signal.SIGINT, _interrupted)
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
        )
        for handler in logging.getLogger().handlers:
            if _no_interrupt_traceback not in handler.filters:
                handler.addFilter(_no_interrupt_traceback)
        code = args.run(args)
        if _deferred:
            raise KeyboardInterrupt
        return code
    except AutotuneError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130
    finally:
        _deferred.clear()
        if ours_term and argv is not None:  # a caller's process keeps its own SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if ours:  # the command line's own run (no argv) has ended: a Ctrl-C during the
            # interpreter's shutdown (JAX's atexit clean-up) would only print a traceback
            ending = signal.SIG_IGN if argv is None else signal.default_int_handler
            signal.signal(signal.SIGINT, ending)
