"""The `autotune` command: tune kernels, list them, and query the tuning database."""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from autotune.errors import AutotuneError, SignatureError
from autotune.signature import parse_dtype

FORMATS = ("table", "json", "csv")


class UsageError(AutotuneError):
    """A command line that cannot be carried out as written."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """'256x128,128x64' -> [(256, 128), (128, 64)]; '1024' is 1-D; 'scalar' is ()."""
    shapes = []
    for part in text.split(","):
        part = part.strip()
        if part in ("scalar", "()"):
            shapes.append(())
            continue
        dims = part.lower().split("x")
        if not part or not all(d.isdigit() for d in dims):
            raise SignatureError(
                f"malformed --shape {text!r}: write e.g. 256x256,256x128 (one per argument)"
            )
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def parse_dtypes(text: str, n: int) -> list[str]:
    """One dtype for every argument, or one per argument: 'float32' or 'bfloat16,float32'."""
    names = [parse_dtype(t) for t in text.split(",")]
    if len(names) == 1:
        return names * n
    if len(names) != n:
        raise SignatureError(
            f"--dtype gives {len(names)} dtypes for {n} shapes: give one, or one per shape"
        )
    return names


def parse_static(items: Sequence[str]) -> dict[str, Any]:
    """--static causal=true --static sm_scale=0.125: values are JSON (bare words are strings)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise SignatureError(f"malformed --static {item!r}: write name=value, e.g. causal=true")
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autotune", description="Autotune block sizes of JAX Pallas kernels.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("tune", help="tune a kernel for one call signature on this device")
    t.add_argument("kernel", help="a registered kernel name, or package.module:function")
    t.add_argument("--shape", required=True, help="argument shapes, e.g. 256x256,256x256")
    t.add_argument(
        "--dtype", default="float32", help="dtype of every argument, or one per argument"
    )
    t.add_argument(
        "--static", action="append", default=[], metavar="NAME=VALUE", help="a static argument"
    )
    t.add_argument("--trials", type=int, default=32, help="distinct configurations to measure")
    t.add_argument("--strategy", choices=("tpe", "gp", "cmaes", "random", "grid"), default="tpe")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    t.add_argument(
        "--patience", type=int, default=None, help="stop after N trials without improvement"
    )
    t.add_argument(
        "--db",
        default=None,
        help="SQLAlchemy URL or file (default: $PALLAS_AUTOTUNE_DB or the user cache)",
    )

    sub.add_parser("kernels", help="list registered kernels and their tunable parameters")

    d = sub.add_parser("db", help="query the tuning database")
    dsub = d.add_subparsers(dest="db_command", required=True, parser_class=_Parser)
    for name, help_ in (("list", "best entries"), ("trials", "every measured trial")):
        q = dsub.add_parser(name, help=help_)
        q.add_argument("--kernel")
        q.add_argument("--device-kind")
        q.add_argument("--platform")
        q.add_argument("--dtype")
        q.add_argument("--format", choices=FORMATS, default="table")
        q.add_argument("--db", default=None)
    add_landscape_parser(dsub)
    return p


def add_landscape_parser(dsub: Any) -> None:
    q = dsub.add_parser(
        "landscape", help="write an exhaustive run's trials as a landscape CSV (for replay)"
    )
    q.add_argument("--kernel", required=True)
    q.add_argument("--signature", required=True, help="e.g. f32[64,128]")
    q.add_argument("--device-kind")
    q.add_argument("--output", "-o", help="file to write (.csv, or .csv.gz); default: stdout")
    q.add_argument("--db", default=None)


def cmd_db_landscape(args: argparse.Namespace) -> int:
    from autotune.db import TuningDB
    from autotune.landscape import landscape_rows, write_landscape

    with TuningDB(args.db) as db:
        header, rows = landscape_rows(db, args.kernel, args.signature, args.device_kind)
    text = write_landscape(args.output, header, rows)
    if args.output is None:
        print(text, end="")
    else:
        print(f"wrote {len(rows)} configurations to {args.output}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
        )
        return COMMANDS[args.command](args)
    except AutotuneError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130


def cmd_tune(args: argparse.Namespace) -> int:
    import jax

    from autotune.registry import resolve
    from autotune.tuner import tune

    if args.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {args.trials}")
    if "" not in sys.path:  # import paths name the user's modules, found from where they stand
        sys.path.insert(0, "")
    kernel = resolve(args.kernel)
    shapes = parse_shapes(args.shape)
    dtypes = parse_dtypes(args.dtype, len(shapes))
    static = parse_static(args.static)
    inputs = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes)]

    def progress(trial: Any, i: int, n: int) -> None:
        time = f"{trial.time_s * 1e3:9.4f} ms" if trial.time_s is not None else " " * 12
        print(
            f"trial {i:3d}/{n}  {trial.status:13s} {time}  {_config_text(trial.config)}", flush=True
        )

    try:
        result = tune(
            kernel,
            inputs,
            n_trials=args.trials,
            db=args.db,
            strategy=args.strategy,
            seed=args.seed,
            time_limit_s=args.time_limit,
            patience=args.patience,
            kwargs=static,
            progress=progress,
        )
    except TypeError as e:  # the kernel's own signature refused the arguments
        raise UsageError(
            f"{args.kernel} cannot be called with --shape {args.shape} --static {static}: {e}"
        ) from None
    speedup = f"{result.speedup:.2f}x" if result.speedup else "n/a"
    default = f"{result.default_time_s * 1e3:.4f} ms" if result.default_time_s else "failed"
    print(
        f"\n{result.kernel} {result.key.signature} on {result.key.device_kind} ({result.key.backend})\n"
        f"  best     {_config_text(result.best_config)}  {result.best_time_s * 1e3:.4f} ms\n"
        f"  default  {_config_text(result.default_config)}  {default}\n"
        f"  speedup  {speedup}   trials {len(result.trials)}   rejected {result.n_rejected}\n"
        f"  stored in {result.db_url}"
    )
    return 0


def cmd_kernels(args: argparse.Namespace) -> int:
    from autotune.device import current_device
    from autotune.registry import registered

    platform = current_device().platform
    rows = []
    for name, kernel in registered().items():
        spec = kernel.spec
        space = spec.space(platform)
        params = "; ".join(f"{p.name} in {list(p.values)}" for p in space.params)
        rows.append({"kernel": name, "version": spec.version, f"parameters ({platform})": params})
    print(_table(rows))
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from autotune.db import TuningDB

    if args.db_command == "landscape":
        return cmd_db_landscape(args)

    filters = {
        "kernel": args.kernel,
        "device_kind": args.device_kind,
        "platform": args.platform,
        "dtype": args.dtype,
    }
    with TuningDB(args.db) as db:
        rows = db.query(**filters) if args.db_command == "list" else db.trials(**filters)
    print(render(rows, args.format))
    return 0


COMMANDS = {"tune": cmd_tune, "kernels": cmd_kernels, "db": cmd_db}


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2, default=str)
    if fmt == "csv":
        buf = io.StringIO()
        if rows:
            w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            for r in rows:
                w.writerow(
                    {
                        k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                        for k, v in r.items()
                    }
                )
        return buf.getvalue().rstrip("\n")
    return _table([_table_row(r) for r in rows]) if rows else "(no rows)"


_TABLE_COLUMNS = (
    "id",
    "kernel",
    "device_kind",
    "signature",
    "static",
    "status",
    "config",
    "time_s",
    "default_time_s",
    "speedup",
    "n_trials",
    "n_rejected",
)


def _table_row(r: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k in _TABLE_COLUMNS:
        if k not in r or (k == "static" and r[k] == "{}"):
            continue
        v = r[k]
        if k == "config":
            v = _config_text(v) if isinstance(v, dict) else str(v)
        elif k.endswith("time_s") and v is not None:
            k, v = k.replace("_s", "_ms"), f"{v * 1e3:.4f}"
        elif k == "speedup" and v is not None:
            v = f"{v:.2f}x"
        out[k] = "" if v is None else v
    return out


def _config_text(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()))


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    sys.exit(main())
