"""Rows as a table, JSON or CSV: what the commands print."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from autotune.trial import config_text

FORMATS = ("table", "json", "csv")


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
    return table([_table_row(r) for r in rows]) if rows else "(no rows)"


_TABLE_COLUMNS = (
    "id",
    "kernel",
    "device_kind",
    "signature",
    "static",
    "status",
    "duplicate_of",  # trials: the trial that measured its program
    "oracle",  # trials: which oracle judged it
    "device",  # trials: the local device that measured it ("gpu:3")
    "workload",  # trials: what made the kernel's integer data arguments (group sizes)
    "transferred_from",  # trials: the other device kinds whose results had it measured first
    "config",
    "time_s",
    "memory_peak_bytes",  # trials: the compiler's peak memory of its program
    "default_time_s",
    "speedup",
    "n_trials",
    "n_rejected",
    # db stats
    "entries",
    "trials",
    "misses",
    "median_speedup",
    "max_speedup",
    # db list --shipped
    "served",
)


# columns a table shows only where some row has a value
_SPARSE = {"duplicate_of", "memory_peak_bytes", "workload", "transferred_from"}


def _table_row(r: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k in _TABLE_COLUMNS:
        if k not in r or (k == "static" and r[k] == "{}") or (k in _SPARSE and r[k] is None):
            continue
        v = r[k]
        if k == "config":
            v = config_text(v) if isinstance(v, dict) else str(v)
        elif k.endswith("time_s"):
            k, v = k.replace("_s", "_ms"), None if v is None else f"{v * 1e3:.4f}"
        elif k == "memory_peak_bytes":
            k, v = "peak_memory", byte_text(v)
        elif k.endswith("speedup") and v is not None:
            v = f"{v:.2f}x"
        out[k] = "" if v is None else v
    return out


def byte_text(n: int) -> str:
    """'768.0 KiB': a number of bytes in binary units."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
