"""Split: which axes of a kernel's arrays are batch-like, so that a call on arrays sharded
along them runs on each device's part (autotune.runtime.sharded)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import KernelError

ELLIPSIS = "..."


@dataclass(frozen=True)
class Split:
    """How a kernel's call splits over devices: `axes` names each array argument's axes and the
    outputs' as einsum does ("mk,kn->mn"; "..." for any leading axes, "...c,c->...c"), and
    `along` the letters (or "...") that each device may compute a part of on its own."""

    axes: str
    along: str

    def __post_init__(self) -> None:
        ins, arrow, outs = self.axes.partition("->")
        letters = set(self.axes.replace(ELLIPSIS, "")) - set(",->")
        if not arrow or not ins or not outs or not all(c.isalpha() for c in letters):
            raise KernelError(
                f"Split({self.axes!r}): write the arrays' axes then the outputs', e.g. 'mk,kn->mn'"
            )
        unknown = set(self.along.replace(ELLIPSIS, "")) - letters
        if unknown or (ELLIPSIS in self.along and ELLIPSIS not in self.axes):
            raise KernelError(
                f"Split({self.axes!r}, along={self.along!r}): along names axes the arrays lack"
            )

    @property
    def inputs(self) -> list[str]:
        return self.axes.split("->")[0].split(",")

    @property
    def outputs(self) -> list[str]:
        return self.axes.split("->")[1].split(",")

    def parallel(self, letter: str) -> bool:
        return letter in self.along.replace(ELLIPSIS, "") or (
            letter.isdigit() and ELLIPSIS in self.along
        )
