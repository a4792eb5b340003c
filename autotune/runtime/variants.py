"""Variant groups: one callable over several implementations of an op, serving the fastest.

`variants(name, members)` registers a group under `name`. To the runtime, the database and the
tools a group is a kernel whose one tunable parameter is `variant`, the member's name: its entry
(under the group's own key, beside each member's) says which member won for a call, and a call
looks it up like any kernel's (overlay, database, shipped table, then the fallback) at trace
time, then calls that member, which looks its own configuration up. Without an entry the group
serves its first member that can run here. Tuning a group is autotune.tuning.group.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import registry
from autotune.backends.platforms import PLATFORMS
from autotune.device import DeviceInfo, current_device
from autotune.errors import KernelError
from autotune.registry.spec import KernelSpec, tuned_path
from autotune.runtime.decorator import AutotunedKernel
from autotune.runtime.lookup import Resolution
from autotune.runtime.state import warn_once
from autotune.signature import Signature, is_array
from autotune.space import Param

PARAM = "variant"  # the group's one tunable parameter: a member's name


@dataclass(frozen=True)
class Member:
    """One implementation in a variant group: an @autotuned kernel, or a plain function (an XLA
    implementation, a third-party kernel) with no tunables.

    `name` defaults to the kernel's registered name or the function's `__name__`; `why_not`,
    if given, says why the member cannot run on a device (a DeviceInfo: e.g. it needs a Hopper
    GPU), or returns None where it can.
    """

    fn: Callable
    name: str | None = None
    why_not: Callable[[DeviceInfo], str | None] | None = None

    @property
    def kernel(self) -> AutotunedKernel | None:
        """The autotuned kernel, or None for a plain function."""
        return self.fn if isinstance(self.fn, AutotunedKernel) else None


class VariantGroup(AutotunedKernel):
    """A callable with its members' call signature that calls the member chosen for the call."""

    def __init__(
        self, name: str, members: Sequence[Member | Callable], tuned: Path | None = None
    ) -> None:
        self.members: dict[str, Member] = {}
        for item in members:
            member = _member(name, item)
            if member.name in self.members:
                raise KernelError(
                    f"variant group {name!r}: two members named {member.name!r}: give one "
                    "another name with autotune.Member(fn, name=...)"
                )
            self.members[member.name] = member
        if not self.members:
            raise KernelError(f"variant group {name!r} has no members: give at least one")
        super().__init__(self._group_spec(name, tuned))

    def __repr__(self) -> str:
        return f"<variant group {self.spec.name!r}: {', '.join(self.members)}>"

    def _group_spec(self, name: str, tuned: Path | None) -> KernelSpec:
        names = tuple(self.members)
        first = next(iter(self.members.values()))

        def dispatch(*args: Any, variant: str = names[0], interpret: bool = False, **kwargs: Any):
            member = self.members.get(variant)
            if member is None:
                raise KernelError(
                    f"variant group {name!r} has no member {variant!r}: give one of {', '.join(names)}"
                )
            kernel = member.kernel
            pinned = (
                {k: kwargs.pop(k) for k in kernel.spec.tunables & kwargs.keys()} if kernel else {}
            )
            if pinned:  # a member's configuration given (a group's tuning): no lookup
                return kernel.spec.bound_function(pinned, interpret=interpret)(*args, **kwargs)
            # otherwise each member looks up its configuration, and chooses its interpret mode
            return member.fn(*args, **kwargs)

        params = [p for p in _call_parameters(first) if p.kind is not p.VAR_KEYWORD]
        params += [
            inspect.Parameter(PARAM, inspect.Parameter.KEYWORD_ONLY, default=names[0]),
            inspect.Parameter("interpret", inspect.Parameter.KEYWORD_ONLY, default=False),
        ]
        params += [p for p in _call_parameters(first) if p.kind is p.VAR_KEYWORD]
        dispatch.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        dispatch.__name__ = dispatch.__qualname__ = name
        dispatch.__doc__ = f"Variant group {name!r} of {', '.join(names)}."
        return KernelSpec(
            name=name,
            fn=dispatch,
            spaces={p: (Param(PARAM, names),) for p in PLATFORMS},
            constraints=(),
            defaults={PARAM: names[0]},
            reference=None,
            versioned=self._version,
            bind=None,
            bound_names=frozenset({PARAM}),
            takes_interpret=True,
            tuned=tuned,
            split=first.kernel.spec.split if first.kernel else None,
            # the members take the first's arguments: its workloads make their data
            workloads=first.kernel.spec.workloads if first.kernel else {},
            _recognised={"backend": None},  # a group's key names no backend: its members' do
        )

    def _version(self) -> str:
        """A hash of the members' names and versions (a plain function's: its name)."""
        hasher = hashlib.sha256()
        for member in self.members.values():
            kernel = member.kernel
            what = kernel.spec.version if kernel else _qualified(member.fn)
            hasher.update(f"{member.name}:{what}\0".encode())
        return hasher.hexdigest()[:12]

    # ------------------------------------------------------------------ members

    def why_not(
        self,
        member: Member,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        device: DeviceInfo | None = None,
    ) -> str | None:
        """Why `member` cannot run this call on `device` (default: this process's), or None
        where it can: its own `why_not`, then whether it traces for these arguments (shapes
        only, in this process)."""
        return self._refusal(member, device or current_device()) or self._trace_failure(
            member, args, kwargs
        )

    @staticmethod
    def _refusal(member: Member, device: DeviceInfo) -> str | None:
        """Why `member` does not run on `device` by its own declaration, or None."""
        reason = member.why_not(device) if member.why_not else None
        if reason:
            return reason
        kernel = member.kernel
        if kernel is not None and device.platform not in kernel.spec.spaces:
            return f"{member.name} has no search space for {device.platform}"
        return None

    @staticmethod
    def _trace_failure(
        member: Member, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str | None:
        """What `member` raised when traced for these arguments (shapes only), or None."""
        import jax

        kernel = member.kernel
        at = [i for i, a in enumerate(args) if is_array(a)]

        def call(*arrays: Any) -> Any:
            full = list(args)
            for i, a in zip(at, arrays):
                full[i] = a
            if kernel is None:
                return member.fn(*full, **kwargs)
            sig = kernel.spec.signature(full, kwargs, current_device())
            config = kernel.spec.default_config(sig)
            return kernel.spec.bound_function(config, interpret=True)(*full, **kwargs)

        try:
            jax.eval_shape(call, *(jax.ShapeDtypeStruct(args[i].shape, args[i].dtype) for i in at))
        except Exception as e:  # whatever refuses the call is the reason, never the group's error
            return f"{type(e).__name__}: {e}".splitlines()[0]
        return None

    def runnable(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], device: DeviceInfo | None = None
    ) -> tuple[list[Member], dict[str, str]]:
        """The members that can run this call on `device` (default: this process's), in order,
        and why each other cannot."""
        kwargs = {k: v for k, v in kwargs.items() if k != PARAM}
        ok, skipped = [], {}
        for member in self.members.values():
            reason = self.why_not(member, args, kwargs, device)
            if reason is None:
                ok.append(member)
            else:
                skipped[member.name] = reason
        return ok, skipped

    def resolve(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], record_miss: bool = True
    ) -> Resolution:
        """As a kernel's lookup; a member chosen elsewhere (an entry of a nearest shape, an
        overlay or a table from another environment) that cannot run here gives way to the
        first member that can, with one warning."""
        found = super().resolve(args, kwargs, record_miss)
        if found.source == "default":
            return found
        kwargs = {k: v for k, v in kwargs.items() if k != PARAM}
        name = found.config[PARAM]
        reason = self.why_not(self.members[name], args, kwargs)
        if reason is None:
            return found
        config = self._default_config(found.signature, args, kwargs, quiet=True)
        warn_once(
            f"variant:{found.key}:{name}",
            f"pallas-autotune: {self.spec.name} {found.key.signature}: the {found.source} "
            f"entry chose {name}, which cannot run here ({reason}); calling {config[PARAM]}",
        )
        return Resolution(config, "default", found.key, found.signature)

    def _default_config(
        self, sig: Signature, args: Sequence[Any], kwargs: Mapping[str, Any], quiet: bool = False
    ) -> dict[str, Any]:
        """The first member that can run the call; members ahead of it that raised when traced
        are said in one warning, unless `quiet` (the caller says why it came here)."""
        kwargs = {k: v for k, v in kwargs.items() if k != PARAM}
        device = current_device()
        raised: dict[str, str] = {}
        for member in self.members.values():
            if self._refusal(member, device):  # declared: nothing to say
                continue
            failure = self._trace_failure(member, args, kwargs)
            if failure is None:
                if raised and not quiet:  # perhaps a bug in a member: say so, not hide it
                    warn_once(
                        f"variant-raised:{self.spec.name}:{sig.text}:{sig.static}",
                        f"pallas-autotune: {self.spec.name} {sig.text}: "
                        + "; ".join(
                            f"member {n} raised when traced ({r})" for n, r in raised.items()
                        )
                        + f"; calling {member.name}",
                    )
                return {PARAM: member.name}
            raised[member.name] = failure
        _, skipped = self.runnable(args, kwargs)
        raise KernelError(
            f"no member of variant group {self.spec.name!r} can run {sig.text} here: "
            + "; ".join(f"{n}: {r}" for n, r in skipped.items())
        )

    def explain(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """What a call would use: `variant` (the member's name), its `config` (empty for a plain
        function) and `source` (where the group's choice came from), the group's `key`, the
        member's own explanation (`member`), and `skipped`: the members that cannot run this
        call here, with the reason."""
        group = super().explain(*args, **kwargs)
        name = group["config"][PARAM]
        member_kwargs = {k: v for k, v in kwargs.items() if k != PARAM}
        kernel = self.members[name].kernel
        inner = kernel.explain(*args, **member_kwargs) if kernel is not None else None
        return {
            "variant": name,
            "config": inner["config"] if inner else {},
            "source": group["source"],
            "key": group["key"],
            "signature": group["signature"],
            "detail": group["detail"],
            "member": inner,
            "skipped": self.runnable(args, member_kwargs)[1],
        }


def _member(group: str, item: Member | Callable) -> Member:
    member = item if isinstance(item, Member) else Member(item)
    if not callable(member.fn):
        raise KernelError(f"variant group {group!r}: member {member.fn!r} is not callable")
    kernel = member.kernel
    name = member.name or (kernel.spec.name if kernel else getattr(member.fn, "__name__", ""))
    if not name or not name.isidentifier():
        raise KernelError(
            f"variant group {group!r}: member {member.fn!r} has no usable name ({name!r}): "
            "give it one with autotune.Member(fn, name='...')"
        )
    if isinstance(member.fn, VariantGroup):
        raise KernelError(f"variant group {group!r}: nested groups are not supported ({name})")
    return Member(member.fn, name, member.why_not)


def _call_parameters(member: Member) -> list[inspect.Parameter]:
    """The member's call signature: an autotuned kernel's without its tunables."""
    kernel = member.kernel
    fn = kernel.spec.fn if kernel else member.fn
    hidden = (kernel.spec.bound_names if kernel else frozenset()) | {"interpret", PARAM}
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: take anything
        return [
            inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
            inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
        ]
    return [p for p in params if p.name not in hidden]


def _qualified(fn: Callable) -> str:
    fn = getattr(fn, "func", fn)  # a functools.partial: the function it binds
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"


def variants(
    name: str, members: Sequence[Member | Callable], *, tuned: str | Path | None = None
) -> VariantGroup:
    """A variant group of `members` (each an @autotuned kernel, a plain function, or a
    Member), registered under `name`. It takes the first member's call signature, and calls
    the member tuned fastest for the call (`autotune.tune(group, args)`), or, untuned, the
    first member that can run here. `tuned=`: the group's choices shipped with a library, as
    a kernel's (`autotune db export --kernel NAME`), relative to the calling module."""
    caller = sys._getframe(1).f_globals
    file = caller.get("__file__")
    module_dir = Path(file).resolve().parent if file else None
    group = VariantGroup(name, members, tuned_path(name, tuned, module_dir))
    # a device worker imports the group as MODULE:NAME, where this was called (autotune.registry.
    # import_path): the shipped groups are module attributes of their own names
    group.spec.fn.__module__ = caller.get("__name__", __name__)
    taken = registry.registered().get(name)
    if name in group.members or (taken is not None and not isinstance(taken, VariantGroup)):
        raise KernelError(
            f"variant group {name!r} would hide the kernel of that name: name the group for the "
            "op, e.g. 'matmul_variants'"
        )
    registry.add(group)
    return group
