"""`autotune report`: an HTML report (and PNGs) of what was tuned, or of a program's calls."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.cli.common import DB_HELP, add_import_argument, import_user_modules
from autotune.cli.db import check_arguments
from autotune.errors import AutotuneError


def add_parser(sub: Any) -> None:
    r = sub.add_parser("report", help="an HTML report of tuned entries (PNGs with matplotlib)")
    which = r.add_mutually_exclusive_group()
    which.add_argument("--kernel", help="only this kernel's entries")
    which.add_argument(
        "--program",
        metavar="MODULE:FACTORY",
        help="a program's calls first (as `autotune calls` lists them: where each is served "
        "from, its default and tuned time), then the entries serving them",
    )
    r.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    r.add_argument("--db", default=None, help=DB_HELP)
    r.add_argument("--no-png", action="store_true", help="write the HTML page only")
    add_import_argument(r)
    r.set_defaults(run=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from autotune import report
    from autotune.db import TuningDB

    report.check_out(args.out)
    check_arguments(args)
    import_user_modules(args)
    with TuningDB(args.db, create=False, skip_tampered=True) as db:
        if args.kernel is not None and not db.query(kernel=args.kernel):
            # as `db export` refuses the same filter: an empty report would pass for one
            raise AutotuneError(
                f"no entries match --kernel {args.kernel}: no report written (see "
                "`autotune db list`)"
            )
        if args.program is not None and args.db is not None:
            import autotune

            autotune.configure(db=args.db)  # the program's calls are looked up where it reports
        try:
            index, pngs = report.write(
                db, args.out, kernel=args.kernel, program=args.program, pngs=not args.no_png
            )
        except OSError as e:
            raise AutotuneError(
                f"--out {args.out}: cannot write the report there ({e.strerror or e}): give a "
                "directory that can be written"
            ) from None
    print(f"wrote {index}" + (f" and {len(pngs)} PNG files" if pngs else ""))
    return 0
