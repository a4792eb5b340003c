"""A configuration and its identity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Config = dict[str, Any]  # tunable parameter name -> value: what a candidate is
ConfigId = tuple  # config_id's result


def config_id(config: Mapping[str, Any]) -> ConfigId:
    """A hashable identity of a config (types included: True is not 1 here, nor 8 8.0)."""
    return tuple(sorted((k, type(v).__name__, v) for k, v in config.items()))
