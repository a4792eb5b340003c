"""Export the trials of an exhaustive tuning run as a landscape CSV, for `search.replay`.

The format is that of the recorded landscapes (../shared/landscapes/README.md): a column per
parameter, `time_ms` (empty for a failure) and `status`; gzipped when the file ends in .gz.
"""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path
from typing import Any

from autotune.db import TuningDB
from autotune.errors import DatabaseError


def landscape_rows(
    db: TuningDB, kernel: str, signature: str, device_kind: str | None = None
) -> tuple[list[str], list[list[Any]]]:
    """The header and rows of the run with the most distinct configurations for this kernel
    and signature (the latest of equals): the exhaustive one, when there is one."""
    trials = db.trials(kernel=kernel, signature=signature, device_kind=device_kind)
    if not trials:
        raise DatabaseError(
            f"no trials of {kernel} for signature {signature} in {db.url}: "
            "see `autotune db trials --kernel` for the stored signatures"
        )
    runs: dict[str, dict[str, Any]] = {}
    for t in trials:
        if isinstance(t.config, dict):  # undecodable configs are not part of any landscape
            runs.setdefault(t.run_id, {})[_text(t.config)] = t  # a config's last trial
    if not runs:
        raise DatabaseError(
            f"no trial of {kernel} for signature {signature} in {db.url} has a readable config: "
            "see `autotune db check`"
        )
    order = list(runs)
    best_run = max(order, key=lambda r: (len(runs[r]), order.index(r)))
    rows = list(runs[best_run].values())
    names = list(rows[0].config)
    if any(sorted(r.config) != sorted(names) for r in rows):
        raise DatabaseError(f"run {best_run} of {kernel} mixes configurations of different spaces")
    body = []
    for r in rows:
        ok = r.status == "ok" and r.time_s is not None
        time_ms = repr(r.time_s * 1e3) if ok else ""
        body.append([r.config[n] for n in names] + [time_ms, r.status])
    return [*names, "time_ms", "status"], body


def write_landscape(path: str | Path | None, header: list[str], rows: list[list[Any]]) -> str:
    """Write CSV text to `path` (gzipped for .gz) or return it when `path` is None."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    text = buf.getvalue()
    if path is not None:
        path = Path(path)
        data = text.encode("utf-8")
        try:
            path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
        except OSError as e:
            raise DatabaseError(f"cannot write the landscape to {path}: {e.strerror or e}") from e
    return text


def _text(config: dict[str, Any]) -> str:
    return repr(sorted(config.items()))
