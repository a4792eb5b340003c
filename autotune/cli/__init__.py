"""The `autotune` command: tune kernels, check and list them, query the tuning database, report.

One module per command group (tune, check, kernels, db, report); each adds its parser and sets
the function that runs it. Bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
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


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C, raised by this command's handler."""

    signum = signal.SIGINT


class _Terminated(SystemExit):
    """SIGTERM, raised by this command's handler: it ends the run as Ctrl-C does (what was
    measured and stored is counted first), with exit code 143."""

    signum = signal.SIGTERM


_swallowed: list[int] = []  # a signal whose exception a callback swallowed, not yet raised again
_passed_on: list[Any] = []  # the unraisable hook ours stands in front of, while a command runs


def _interrupted(signum: int, frame: Any) -> None:
    _raise(signum, frame, _Interrupted())


def _terminated(signum: int, frame: Any) -> None:
    _raise(signum, frame, _Terminated(128 + signum))


def _raise(signum: int, frame: Any, exc: BaseException) -> None:
    if _inside(frame, _unraisable.__code__):
        # raised here, the exception would be lost with the one the hook is keeping
        _swallowed.append(signum)
        _redeliver_soon()
        return
    _swallowed.clear()  # raised now; if a callback swallows it again, it is kept again
    raise exc


def _inside(frame: Any, code: Any) -> bool:
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _unraisable(u: Any) -> None:
    """The unraisable hook that keeps our signals: what a handler raises inside a garbage-
    collector or weakref callback or a __del__ (JAX runs one at every collection) is printed
    and dropped ("Exception ignored in ..."), and the run would go on. The signal is sent
    again a moment later, outside the callback, or raised when the command returns, whichever
    comes first; other unraisable exceptions go to the hook it stands in front of."""
    if not isinstance(u.exc_value, (_Interrupted, _Terminated)):
        _passed_on[-1](u)
        return
    _swallowed.append(u.exc_value.signum)
    _redeliver_soon()


def _redeliver_soon() -> None:
    # a thread started without waiting for it to start: a signal landing in a wait inside the
    # hook would be raised there, where nothing catches it
    _thread.start_new_thread(_redeliver, ())


def _redeliver() -> None:
    time.sleep(0.01)
    if _swallowed:
        os.kill(os.getpid(), _swallowed[-1])


def _raise_swallowed() -> None:
    if _swallowed:
        handler = _terminated if _swallowed[-1] == signal.SIGTERM else _interrupted
        handler(_swallowed[-1], None)


def _no_interrupt_traceback(record: logging.LogRecord) -> bool:
    # SQLAlchemy's pool logs a Ctrl-C (or SIGTERM) that lands while it resets a connection, with a
    # traceback, before re-raising it; the re-raised interrupt ends the run with one line below
    return not (record.exc_info and isinstance(record.exc_info[1], (_Interrupted, _Terminated)))


def _reader_gone() -> int:
    # what is left in stdout's buffer cannot be written at exit either: send it nowhere
    with contextlib.suppress(OSError, ValueError):  # no file (a caller's capture): nothing left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    main_thread = threading.current_thread() is threading.main_thread()
    # not if SIGINT is ignored (a background job), nor if the caller handles it
    ours = main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ours_term = main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if ours_term:
        signal.signal(signal.SIGTERM, _terminated)
    if ours:
        signal.signal(signal.SIGINT, _interrupted)
    unraisable = sys.unraisablehook
    if ours or ours_term:
        _passed_on.append(unraisable)
        sys.unraisablehook = _unraisable
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
        )
        for handler in logging.getLogger().handlers:
            if _no_interrupt_traceback not in handler.filters:
                handler.addFilter(_no_interrupt_traceback)
        code = args.run(args)
        sys.stdout.flush()  # a reader gone is found here, not at exit (where it is a traceback)
        _raise_swallowed()
        return code
    except AutotuneError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130
    except _Terminated as e:  # the same line as Ctrl-C's: the run did not end by itself
        print("autotune: terminated", file=sys.stderr)
        return e.code
    except BrokenPipeError:  # `autotune calls ... | head`: the reader has all it wanted
        return _reader_gone()
    finally:
        _swallowed.clear()
        sys.unraisablehook = unraisable
        if ours or ours_term:
            _passed_on.pop()
        if ours_term and argv is not None:  # a caller's process keeps its own SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if ours:  # the command line's own run (no argv) has ended: a Ctrl-C during the
            # interpreter's shutdown (JAX's atexit clean-up) would only print a traceback
            ending = signal.SIG_IGN if argv is None else signal.default_int_handler
            signal.signal(signal.SIGINT, ending)
