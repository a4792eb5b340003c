"""Warm starts: the best configurations already stored for the same kernel and device at the
nearest shapes, to measure before the sampler proposes anything."""

from __future__ import annotations

import logging
from typing import Any

from autotune.errors import AutotuneError
from autotune.signature import Signature, TuningKey, parse_args, shape_distance
from autotune.space import Space
from autotune.trial import Config, ConfigId, config_id

log = logging.getLogger(__name__)


def warm_starts(
    db: Any, key: TuningKey, sig: Signature, space: Space, limit: int = 3
) -> list[Config]:
    """Up to `limit` stored best configs of this kernel (same version) on this device kind,
    nearest shapes first, that are valid for `sig`. The database is optional here: any
    failure to read it means no warm start, never a failed tuning run."""
    from autotune.db import TuningDB

    try:
        handle = db if isinstance(db, TuningDB) else TuningDB(db)
        try:
            entries = handle.query(
                kernel=key.kernel,
                kernel_version=key.kernel_version,
                platform=key.platform,
                device_kind=key.device_kind,
            )
        finally:
            if handle is not db:
                handle.close()
    except AutotuneError as e:
        log.warning("no warm start for %s: %s", key.kernel, e)
        return []
    ranked = []
    for e in entries:
        try:
            distance = shape_distance(parse_args(e.key.signature), sig.args)
        except AutotuneError:  # a malformed stored signature: data, skip it
            continue
        config = e.config
        if distance is None or space.check_stored(config) is not None:
            continue
        if space.is_valid(config, sig):
            same_static = e.key.static == key.static
            ranked.append((not same_static, distance, e.id, config))
    ranked.sort(key=lambda r: r[:3])
    out: dict[ConfigId, Config] = {}  # the nearest entry of each config
    for *_, config in ranked:
        out.setdefault(config_id(config), config)
    return list(out.values())[:limit]
