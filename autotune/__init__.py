"""pallas-autotune: find, verify, store and serve the best block sizes for Pallas kernels.

The runtime surface (``autotuned``, ``register``, ``configure``, ``variants``, ``overlay``,
``out_struct``, ``Split``, ``Example``) is cheap to import; ``tune`` and
``TuningDB`` load the tuner (Optuna) and the database layer (SQLAlchemy) on first use, and
``TuneSettings`` the measurement's settings (neither); ``BestEntry`` is what
``TuningDB.put_best`` stores.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import (
    AutotuneError,
    DatabaseError,
    KernelError,
    SettingsError,
    SignatureError,
    SpaceError,
)
from autotune.registry.example import Example
from autotune.registry.split import Split
from autotune.registry.varying import out_struct
from autotune.runtime.decorator import AutotunedKernel, autotuned, register
from autotune.runtime.overlays import overlay
from autotune.runtime.state import configure
from autotune.runtime.variants import Member, variants

__all__ = [
    "AutotuneError",
    "AutotunedKernel",
    "BestEntry",
    "DatabaseError",
    "Example",
    "KernelError",
    "Member",
    "SignatureError",
    "SettingsError",
    "SpaceError",
    "Split",
    "TuneResult",
    "TuneSettings",
    "TuningDB",
    "autotuned",
    "calls_in",
    "configure",
    "out_struct",
    "overlay",
    "register",
    "tune",
    "tune_program",
    "variants",
]

_LAZY = {
    "BestEntry": "autotune.trial",
    "calls_in": "autotune.runtime.calls",
    "tune": "autotune.tuning.tune",
    "tune_program": "autotune.service.program",
    "TuneResult": "autotune.tuning.result",
    "TuneSettings": "autotune.tuning.settings",
    "TuningDB": "autotune.db.database",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
