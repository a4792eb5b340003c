"""Split: which axes of a kernel's arrays are batch-like, so that a call on arrays sharded
along them runs on each device's part, and `lay_out`, which decides from a kernel's Split how a
call on sharded arrays runs per device. Both ways the runtime splits a call read it: a
`jax.shard_map` on a mesh's Explicit axes (autotune.runtime.sharded) and XLA's partitioner on
Auto axes (autotune.runtime.partitioned); they differ only in where the arrays' mesh axes come
from (the types jit traces, or the shardings the partitioner chose)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.errors import KernelError

ELLIPSIS = "..."

# The mesh axes one dimension of an array is split over (() where it is whole).
Axes = tuple[str, ...]


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

    def names(self, ndims: Sequence[int | None]) -> tuple[list[list[str]], list[list[str]]]:
        """One name per dimension of each array (of `ndims[i]` dimensions; None for an
        argument that is no array) and each output: its letter, the ellipsis's dimensions named
        "0", "1", ... counted from the right, as many as the first array with one has."""
        n_ellipsis = next(
            (
                max(n - len(axes.replace(ELLIPSIS, "")), 0)
                for axes, n in zip(self.inputs, ndims)
                if ELLIPSIS in axes and n is not None
            ),
            0,
        )

        def named(axes: str) -> list[str]:
            head, dots, tail = axes.partition(ELLIPSIS)
            middle = [str(n_ellipsis - 1 - i) for i in range(n_ellipsis)] if dots else []
            return [*head, *middle, *tail]

        return [named(a) for a in self.inputs], [named(a) for a in self.outputs]

    def backward(self) -> Split:
        """The Split of this kernel's backward: its arrays and its outputs' cotangents in, one
        cotangent per array out, along the same axes."""
        return Split(f"{','.join(self.inputs + self.outputs)}->{','.join(self.inputs)}", self.along)


@dataclass(frozen=True)
class Layout:
    """How a call on sharded arrays runs per device: the mesh axes each dimension of each array
    (`inputs`; [] for an argument that is no array) and of each output stays split over, the
    batch-like axes split (`over`: a letter's mesh axes), and what is gathered to every device
    first (`gathered`: (argument, dimension, mesh axes)). `outputs` is None for a call whose
    kernel declares no Split: everything is gathered, and its outputs are whole."""

    inputs: list[list[Axes]]
    outputs: list[list[Axes]] | None
    over: dict[str, Axes]
    gathered: list[tuple[int, int, Axes]]

    def summed(self, split: Split, ndims: Sequence[int | None]) -> list[Axes]:
        """For each array: the mesh axes its cotangent is summed over, those of the axes split
        that it lacks (matmul's y, rows split: its dy is each device's part of a sum)."""
        names, _ = split.names(ndims)
        return [
            tuple(m for letter, axes in self.over.items() if letter not in own for m in axes)
            for own in names
        ]


def lay_out(split: Split | None, dims: Sequence[Sequence[Axes] | None]) -> Layout:
    """How a call runs per device, given the mesh axes each dimension of each argument is split
    over (`dims[i]`: None for an argument that is no array): each batch-like axis keeps the
    first split it is given where no other axis took those mesh axes; any other split (a
    contracted axis, a batch-like one another array splits otherwise, or any axis of a kernel
    with no Split or whose Split does not name every argument) is gathered."""
    if split is None or len(split.inputs) != len(dims):
        gathered = [
            (i, d, axes) for i, ds in enumerate(dims) for d, axes in enumerate(ds or ()) if axes
        ]
        whole = [[()] * len(ds or ()) for ds in dims]
        return Layout(whole, None, {}, gathered)
    names, out_names = split.names([None if ds is None else len(ds) for ds in dims])
    over: dict[str, Axes] = {}
    gathered = []
    for i, ds in enumerate(dims):
        for d, axes in enumerate(ds or ()):
            letter = names[i][d]
            if not axes or over.get(letter) == axes:
                continue
            taken = {a for used in over.values() for a in used}
            if split.parallel(letter) and letter not in over and not taken & set(axes):
                over[letter] = axes
            else:
                gathered.append((i, d, axes))
    inputs = [
        [over.get(n, ()) for n in own] if ds is not None else [] for own, ds in zip(names, dims)
    ]
    outputs = [[over.get(n, ()) for n in own] for own in out_names]
    return Layout(inputs, outputs, over, gathered)
