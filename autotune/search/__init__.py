"""Proposing configurations: the search loop (loop.py: run_search, which asks a sampler and
tells it what was measured), the samplers (samplers/: one model per module; strategies.py: the
table of names), the Gaussian process they fit (gp.py), the valid configurations (valid_set.py),
a task's shared Optuna study (studies.py), and recorded landscapes searched without a device
(landscapes.py: replay). Search never knows how a configuration is measured.

Importing this package imports no Optuna (the CLI checks strategy names through
strategies.py); `replay` and `run_search` load the loop on first use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"replay": "autotune.search.landscapes", "run_search": "autotune.search.loop"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autotune.search' has no attribute {name!r}")
