"""Transfer: what other device kinds measured of the kernel being tuned, read from the tuning
database (and the kernel's shipped table), handed to the search as plain data
(autotune.search.transfer.OtherDevice). The search knows nothing of the database."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.search.transfer import LEADS, OtherDevice, leads
from autotune.signature import Signature, TuningKey, parse_args, shape_distance
from autotune.space import Space
from autotune.trial import Config, ConfigId, config_id

log = logging.getLogger(__name__)

# statuses that say nothing about the configuration on its device: a duplicate was not
# measured (its program's trial was), and a rejected one ran but computed a wrong result
_SKIPPED = {"duplicate", "rejected"}


def other_devices(
    db: Any, key: TuningKey, sig: Signature, space: Space, shipped: Path | None = None
) -> list[OtherDevice]:
    """For each other device kind with results of this kernel (same version and platform), its
    trials at the shape nearest `sig` (same static arguments first): ran ones with their time,
    failed ones with None. A device kind with no trials in the database but an entry in the
    kernel's `shipped` table gives that entry's best configuration alone. Configurations that
    do not fit `space` are left out. As for warm starts, a database that cannot be read means no
    transfer, never a failed tuning run."""
    from autotune.db import TuningDB

    try:
        handle = db if isinstance(db, TuningDB) else TuningDB(db)
        try:
            trials = handle.trials(
                kernel=key.kernel, kernel_version=key.kernel_version, platform=key.platform
            )
        finally:
            if handle is not db:
                handle.close()
    except AutotuneError as e:
        log.warning("no transfer from other devices for %s: %s", key.kernel, e)
        return []
    shapes: dict[tuple[str, str, str], list[tuple[Config, float | None]]] = {}
    for t in trials:
        if t.key.device_kind == key.device_kind or t.status in _SKIPPED:
            continue
        if space.check_stored(t.config) is not None:
            continue
        time_s = t.time_s if t.status == "ok" and t.time_s else None
        shapes.setdefault((t.key.device_kind, t.key.signature, t.key.static), []).append(
            (t.config, time_s)
        )
    nearest: dict[str, tuple[tuple, list[tuple[Config, float | None]]]] = {}
    for (device, signature, static), measured in shapes.items():
        rank = _shape_rank(signature, static, key, sig)
        if rank is not None and (device not in nearest or rank < nearest[device][0]):
            nearest[device] = (rank, measured)
    out = [OtherDevice(d, tuple(_last_of_each(m))) for d, (_, m) in sorted(nearest.items())]
    return out + _shipped(shipped, key, sig, space, set(nearest))


def _shape_rank(signature: str, static: str, key: TuningKey, sig: Signature) -> tuple | None:
    """How near a stored shape is to the one tuned (lower is nearer; None: not comparable)."""
    try:
        distance = shape_distance(parse_args(signature), sig.args)
    except AutotuneError:  # a malformed stored signature: data, skip it
        return None
    return None if distance is None else (static != key.static, distance)


def _last_of_each(measured: list[tuple[Config, float | None]]) -> list[tuple[Config, Any]]:
    """One result per configuration, the latest (a later run re-measured it)."""
    out: dict[ConfigId, tuple[Config, float | None]] = {}
    for config, time_s in measured:
        out[config_id(config)] = (config, time_s)
    return list(out.values())


def _shipped(
    shipped: Path | None, key: TuningKey, sig: Signature, space: Space, known: set[str]
) -> list[OtherDevice]:
    """The shipped table's best entries of other device kinds the database holds nothing of."""
    if shipped is None:
        return []
    from autotune.db.tables import shipped_table

    try:
        entries = [
            e
            for e in shipped_table(shipped).entries
            if (e.key.kernel, e.key.kernel_version, e.key.platform)
            == (key.kernel, key.kernel_version, key.platform)
        ]
    except AutotuneError as e:
        log.warning("no transfer from the shipped table of %s: %s", key.kernel, e)
        return []
    best: dict[str, tuple[tuple, Config, float]] = {}
    for e in entries:
        device = e.key.device_kind
        if device == key.device_kind or device in known or space.check_stored(e.config):
            continue
        rank = _shape_rank(e.key.signature, e.key.static, key, sig)
        if rank is not None and (device not in best or rank < best[device][0]):
            best[device] = (rank, e.config, e.time_s)
    return [OtherDevice(d, ((c, t),)) for d, (_, c, t) in sorted(best.items())]


def transferred_leads(
    others: Sequence[OtherDevice], space: Space, sig: Signature, skip: Sequence[Config]
) -> dict[ConfigId, tuple[Config, list[str]]]:
    """The configurations to measure first from `others` (autotune.search.transfer.leads),
    valid for `sig` and not among `skip` (measured first anyway), each with the device kinds
    whose results rank it, by config_id, in order."""
    skipped = {config_id(c) for c in skip}
    found = leads(
        others,
        lambda c: config_id(c) not in skipped and space.is_valid(c, sig),
        LEADS,
    )
    return {config_id(c): (c, devices) for c, devices in found}
