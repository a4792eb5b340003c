"""The runtime's settings, from the environment: which database model code is served from,
and what happens on a miss."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

FALLBACKS = ("nearest", "default", "strict")


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
            logging.getLogger("autotune.runtime.decorator").warning(
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
