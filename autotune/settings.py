"""Settings that come from the environment, in one place."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

FALLBACKS = ("nearest", "default", "strict")


def default_db_path() -> Path:
    """The per-user SQLite file: $XDG_CACHE_HOME/pallas-autotune/tuning.db."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pallas-autotune" / "tuning.db"


@dataclass(frozen=True)
class Settings:
    """Runtime settings; each field has its environment variable."""

    db_url: str | None  # PALLAS_AUTOTUNE_DB: an SQLAlchemy URL or a file path; None = default file
    strict: bool  # PALLAS_AUTOTUNE_STRICT=1: raise AutotuneError instead of falling back
    fallback: str  # PALLAS_AUTOTUNE_FALLBACK: nearest (then default) | default | strict

    @classmethod
    def from_env(cls) -> Settings:
        fallback = os.environ.get("PALLAS_AUTOTUNE_FALLBACK", "nearest").strip().lower()
        if fallback not in FALLBACKS:
            logging.getLogger("autotune.runtime").warning(
                "pallas-autotune: PALLAS_AUTOTUNE_FALLBACK=%r is not one of %s: using nearest",
                fallback,
                ", ".join(FALLBACKS),
            )
            fallback = "nearest"
        strict = os.environ.get("PALLAS_AUTOTUNE_STRICT", "").strip().lower() in (
            "1",
            "true",
            "yes",
        )
        return cls(
            db_url=os.environ.get("PALLAS_AUTOTUNE_DB") or None,
            strict=strict or fallback == "strict",
            fallback=fallback,
        )
