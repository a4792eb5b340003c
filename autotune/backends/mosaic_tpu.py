"""Mosaic TPU, Pallas's backend for TPUs: its interpret mode, its lowering check, the chips.

TPU interpret mode runs TPU kernels on a CPU, TPU-only grid specs (scalar prefetch, VMEM
scratch) included; the TPU lowering (which enforces the block-shape rules) runs on a CPU-only
host too. The chip facts below (VMEM per generation, cores a grid splits across) are what the
kernels' constraints and VMEM models use (`scoped_vmem_bytes`, `vmem_budget`), beside the
TPU's tiling rule (`autotune.backends.hardware`), and the layout of grids for megacore chips
(`ParallelGrid`).

Sources: JAX's `jax/_src/pallas/mosaic/tpu_info.py` (VMEM capacity, TensorCores per chip and
whether they join as a megacore, the device_kind names) and JAX's Pallas TPU docs (scoped VMEM
defaults). Leads, not measurements: no TPU has been available to check them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.backends.hardware import MiB

NAME = "mosaic_tpu"
TITLE = "Mosaic TPU"  # in messages
PLATFORM = "tpu"
MARKER = "pallas.mosaic."  # where jax._src keeps its compiler parameters (not mosaic_gpu's)
LOWERING_PLATFORM = "tpu"  # what `.lower(lowering_platforms=...)` calls a TPU
# a profiler trace has the XLA module's time on the TPU; CUPTI is NVIDIA's
TIMERS = ("trace", "wall")
COMPILER_PARAMS = "jax.experimental.pallas.tpu.CompilerParams"
KNOBS = ("vmem_limit_bytes",)  # raises the scoped VMEM limit (see TpuChip, vmem_limit)
KIND_PREFIX = "TPU"  # "TPU v5 lite", "TPU v6e", ...
DEFAULT_KIND = "TPU v5 lite"  # the chip a check assumes where none is named
STICKY_FAULTS = True  # a kernel that failed at run time may leave the TPU unusable
PROCESS_PORT = 8476  # libtpu's default port between the processes of one slice


def pinned_env(index: int, env: Mapping[str, str]) -> dict[str, str]:
    """The environment that gives a process TPU chip `index` alone (a tuning worker pinned to
    it): libtpu's chip visibility and a topology of one chip, one process, and a port of its
    own so that workers beside each other do not meet. The variables of Cloud TPU VMs (newer
    libtpu reads TPU_VISIBLE_CHIPS, older TPU_VISIBLE_DEVICES); not checked on a TPU. A chip is
    one JAX device on v4, v5e, v5p and v6e; on v7x each of its two TensorCores is a device."""
    port = str(PROCESS_PORT + 1 + index)
    chip = str(index)
    return {
        "TPU_VISIBLE_CHIPS": chip,
        "TPU_VISIBLE_DEVICES": chip,
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": port,
        "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
        "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{port}",
        "TPU_MESH_CONTROLLER_PORT": port,
    }


@dataclass(frozen=True)
class TpuChip:
    """One TPU generation's facts, per TensorCore."""

    name: str  # what `autotune check --device-kind` accepts, e.g. "v5e"
    device_kinds: tuple[str, ...]  # what jax's `device.device_kind` says on it
    vmem_bytes: int  # VMEM capacity
    scoped_vmem_bytes: int  # the compiler's default limit, unless vmem_limit_bytes raises it
    grid_cores: int  # cores a kernel's leading "parallel" grid axis is split across (megacore)

    @property
    def vmem_budget(self) -> int:
        """What a kernel that sets vmem_limit_bytes may plan to use: the rest is left to the
        compiler's own scratch (see `vmem_limit`)."""
        return self.vmem_bytes * 3 // 4


# v4 and v5p join their two TensorCores into one device (megacore) and split a kernel's leading
# "parallel" grid axis across them. v7x has two TensorCores per chip too, but no megacore: JAX
# makes each its own device (tpu_info's ChipVersion.supports_megacore), so a kernel runs on one.
# v5e and v6e have one TensorCore.
CHIPS = (
    TpuChip("v2", ("TPU v2",), 16 * MiB, 16 * MiB, 1),
    TpuChip("v3", ("TPU v3",), 16 * MiB, 16 * MiB, 1),
    TpuChip("v4", ("TPU v4",), 16 * MiB, 16 * MiB, 2),
    TpuChip("v5e", ("TPU v5 lite", "TPU v5e"), 128 * MiB, 16 * MiB, 1),
    TpuChip("v5p", ("TPU v5", "TPU v5p"), 64 * MiB, 16 * MiB, 2),
    TpuChip("v6e", ("TPU v6 lite", "TPU v6e"), 128 * MiB, 32 * MiB, 1),
    TpuChip("v7x", ("TPU7x", "TPU7"), 64 * MiB, 32 * MiB, 1),
)
GENERATIONS = tuple(c.name for c in CHIPS)
# A chip the table does not name: the smallest VMEM and limit of any generation, one core.
UNKNOWN_CHIP = TpuChip("unknown", (), 16 * MiB, 16 * MiB, 1)
# Kernels that need more VMEM than this set vmem_limit_bytes; up to it, every generation's
# default scoped limit holds them with room for the compiler's scratch.
DEFAULT_LIMIT_BUDGET = UNKNOWN_CHIP.scoped_vmem_bytes * 3 // 4


def chip(device_kind: str) -> TpuChip | None:
    """The generation a device_kind ("TPU v5 lite") or generation name ("v5e") names."""
    kind = device_kind.strip()
    for c in CHIPS:
        if kind.lower() == c.name or kind in c.device_kinds:
            return c
    return None


def chip_or_default(device_kind: str) -> TpuChip:
    return chip(device_kind) or UNKNOWN_CHIP


def unknown_kind(device_kind: str) -> str | None:
    """Why `device_kind` names no TPU of the table (None: it names one)."""
    if chip(device_kind) is not None:
        return None
    return (
        f"not a TPU this project knows: give a generation ({', '.join(GENERATIONS)}) or "
        "jax's device_kind, e.g. 'TPU v5 lite'"
    )


def scoped_vmem_bytes(device_kind: str) -> int:
    """The VMEM a kernel that keeps the default scoped limit may use on this TPU."""
    return chip_or_default(device_kind).scoped_vmem_bytes


def vmem_budget(device_kind: str) -> int:
    """The VMEM a kernel that sets vmem_limit_bytes from its VMEM model may use on this TPU."""
    return chip_or_default(device_kind).vmem_budget


def vmem_limit(need: int) -> int | None:
    """vmem_limit_bytes for a kernel whose VMEM model says `need` bytes: None (the default
    limit) where every generation's default holds it, else `need` plus a third for the
    compiler's scratch, in whole MiB (the constraints keep `need` within `vmem_budget`, so
    this stays within the chip's capacity)."""
    if need <= DEFAULT_LIMIT_BUDGET:
        return None
    return math.ceil(need * 4 / 3 / MiB) * MiB


def compiler_params(dimension_semantics: tuple[str, ...], vmem_need: int):
    """Mosaic TPU's compiler parameters for a grid with these axis roles ("parallel": its
    steps are independent and may be split across cores; "arbitrary": they run in order, as a
    reduction over it must) and a kernel whose VMEM model says `vmem_need` bytes."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(
        dimension_semantics=dimension_semantics, vmem_limit_bytes=vmem_limit(vmem_need)
    )


@dataclass(frozen=True)
class ParallelGrid:
    """A kernel's grid laid out for megacore: its "parallel" axes (the first ones) in the
    kernel's order, except that one with more than one step goes first. A megacore chip (v4,
    v5p: `TpuChip.grid_cores` 2) splits the leading parallel axis across its two cores, so a
    leading axis of one step (a batch of 1) would leave one core idle. Only axes of one step are
    moved behind it, so the order the steps run in is the kernel's on every chip.

    Index maps and bodies speak in the kernel's own axes: `ids` turns the grid's indices into
    them, `position` says where one of them is in the grid (for `pl.program_id`)."""

    order: tuple[int, ...]  # order[i]: the kernel's parallel axis at grid position i

    @classmethod
    def of(cls, sizes: tuple[int, ...]) -> ParallelGrid:
        """The layout of parallel axes of these sizes (in the kernel's order)."""
        first = next((i for i, n in enumerate(sizes) if n > 1), 0)
        return cls((first, *(i for i in range(len(sizes)) if i != first)))

    def grid(self, sizes: tuple[int, ...], *rest: int) -> tuple[int, ...]:
        """The grid: the parallel axes' sizes laid out, then the other axes' (`rest`)."""
        return (*(sizes[i] for i in self.order), *rest)

    def ids(self, *indices: Any) -> tuple[Any, ...]:
        """The grid's indices (as an index map receives them) in the kernel's axis order."""
        n = len(self.order)
        own: list[Any] = [None] * n
        for position, axis in enumerate(self.order):
            own[axis] = indices[position]
        return (*own, *indices[n:])

    def index_map(self, fn: Callable[..., tuple]) -> Callable[..., tuple]:
        """An index map written in the kernel's axes, for the laid-out grid."""
        return lambda *indices: fn(*self.ids(*indices))

    def position(self, axis: int) -> int:
        """Where the kernel's parallel axis `axis` is in the grid (others stay where they are)."""
        return self.order.index(axis) if axis < len(self.order) else axis


def targets_tpu(platform: str, interpret: bool) -> bool:
    """Whether a kernel laid out for `platform` (`backends.kernel_platform`) takes its TPU
    body: on a TPU, and on a CPU-only host unless `interpret=True`, since there Pallas can
    only lower for a TPU (`autotune check`) or run under TPU interpret mode."""
    return platform != "gpu" and not interpret


@contextlib.contextmanager
def interpret_mode() -> Iterator[None]:
    """Run every Pallas kernel traced inside under TPU interpret mode (for kernels that take
    no `interpret` argument); Pallas reads it while tracing."""
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode():
        yield


def reset_interpret_state() -> None:
    """Clear TPU interpret mode's simulated memory, which it keeps after a kernel raised."""
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()
