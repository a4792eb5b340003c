"""The one exception hierarchy: every message names the input and the fix."""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class of every error pallas-autotune raises on purpose."""


class SpaceError(AutotuneError):
    """A search space (file, dict or constraint) is malformed or empty for a call."""


class SignatureError(AutotuneError):
    """A call's arguments, or a shape/dtype text, cannot form a tuning key."""


class KernelError(AutotuneError):
    """A kernel is unknown, cannot be imported, or disagrees with its reference."""


class DatabaseError(AutotuneError):
    """The tuning database cannot be opened, read or written."""
