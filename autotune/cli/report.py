"""`autotune report`: an HTML report (and PNGs) of what was tuned."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.cli.common import DB_HELP
from autotune.cli.db import check_arguments
from autotune.errors import AutotuneError


def add_parser(sub: Any) -> None:
    r = sub.add_parser("report", help="an HTML report of tuned entries (PNGs with matplotlib)")
    r.add_argument("--kernel")
    r.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    r.add_argument("--db", default=None, help=DB_HELP)
    r.set_defaults(run=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from autotune import report
    from autotune.db import TuningDB

    report.check_out(args.out)
    check_arguments(args)
    with TuningDB(args.db, create=False, skip_tampered=True) as db:
        try:
            index, pngs = report.write(db, args.out, kernel=args.kernel)
        except OSError as e:
            raise AutotuneError(
                f"--out {args.out}: cannot write the report there ({e.strerror or e}): give a "
                "directory that can be written"
            ) from None
    print(f"wrote {index}" + (f" and {len(pngs)} PNG files" if pngs else ""))
    return 0
