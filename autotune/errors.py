"""The one exception hierarchy: every message names the input and the fix."""

from __future__ import annotations

from collections.abc import Mapping


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


class SettingsError(AutotuneError):
    """A tuning setting (a budget, a time limit, a seed...) is out of range. The message is the
    setting's name, then what is wrong; `naming` words it with a front end's own name for it."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name} {problem}")
        self.name, self.problem = name, problem

    def naming(self, names: Mapping[str, str]) -> SettingsError:
        """The same refusal, naming the setting `names[name]` (a flag, a job file's key)."""
        return SettingsError(names.get(self.name, self.name), self.problem)


class JobError(AutotuneError):
    """A job file, a shard or a task cannot be carried out as written."""
