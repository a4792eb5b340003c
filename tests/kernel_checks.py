"""Helpers shared by the kernel-library tests: inputs, per-dtype comparison, TPU lowering, and
the registered kernels the suites that cover every kernel enumerate (each by its example)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from autotune import backends
from autotune.device import DeviceInfo
from autotune.measure.lowering import tpu_lowering_error

# max |out - ref| <= TOL * max(1, max |ref|): float32 differs only in summation order; bfloat16
# results are rounded once more (8 bits of mantissa) than the float32 reference.
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}
TPU = DeviceInfo("tpu", "TPU v5 lite", "mosaic_tpu", jax.__version__, "", "")


def rand(shape, dtype=jnp.float32, seed=0, scale=1.0):
    """Normal samples, drawn by numpy as autotune.measure.inputs draws them: jax.random
    compiles a program at each new shape, a second or more of CPU here."""
    x = scale * np.random.default_rng(seed).standard_normal(shape, np.float32)
    return jnp.asarray(x.astype(dtype))


def close(out, ref, dtype, tol=None):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    a, b = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    assert np.isfinite(a).all()
    bound = (TOL[dtype] if tol is None else tol) * max(1.0, float(np.abs(b).max(initial=0)))
    assert np.abs(a - b).max(initial=0) <= bound


def tpu_configs_lower(kernel, args, kwargs, effective) -> int:
    """Lower every configuration of the kernel's TPU space that its constraints admit for this
    call (one per distinct effective block layout); returns how many were checked."""
    sig = kernel.spec.signature(args, kwargs, TPU)
    admitted = kernel.spec.space("tpu").valid_configs(sig)
    assert admitted, f"the TPU space admits nothing for {sig.text}"
    seen = {}
    for config in admitted:
        seen.setdefault(effective(config), config)
    failures = {
        str(c): err
        for c in seen.values()
        if (err := tpu_lowering_error(kernel, c, args, kwargs)) is not None
    }
    assert not failures, failures
    return len(seen)


# ------------------------------------------------------------ every kernel, from the registry


def with_examples() -> dict[str, Any]:
    """Every registered kernel that declares an example call (each shipped one does: see
    test_registry), by name: what the suites that cover every kernel enumerate."""
    from autotune import registry

    return {n: k for n, k in registry.registered().items() if k.spec.example is not None}


def backward_kernels() -> set[str]:
    """The kernels some kernel's VJP calls, other than the kernel itself (matmul's backward is
    two matmul calls)."""
    return {b for n, k in with_examples().items() for b in k.spec.backward or () if b != n}


def differentiable() -> list[str]:
    """The kernels that declare a backward."""
    return [n for n, k in with_examples().items() if k.spec.differentiates]


def outermost() -> list[str]:
    """The kernels no other kernel's VJP calls: what model code calls (the rest run inside
    their gradients)."""
    return [n for n in with_examples() if n not in backward_kernels()]


def runs_here(kernel) -> bool:
    """Whether the kernel runs in interpret mode at a cost a test can pay: not a Mosaic GPU
    kernel, whose interpret mode simulates the GPU (jax 0.10.2's cannot run JAX's attention)."""
    return not backends.get(kernel.spec.backend).slow_interpret


def lowers_for(kernel, platform: str) -> bool:
    """Whether the kernel is one `platform` compiles (a declared backend names its platform)."""
    declared = kernel.spec.backend
    return declared is None or backends.get(declared).platform == platform


def example_call(kernel) -> tuple[list, dict]:
    """The kernel's example: its arrays as jax.ShapeDtypeStruct, its static arguments."""
    example = kernel.spec.example
    return example.arrays(), dict(example.static)


@contextlib.contextmanager
def cuda_runtime_stub():
    """JAX's Mosaic GPU attention asks the CUDA runtime for its version when it is traced (it
    refuses causal attention on CUDA 12.8 to 12.9.0); a lowering for a GPU on this host, which
    has no CUDA runtime, gets 13.0 instead. Nothing else is stubbed."""
    import importlib.util
    import types

    if importlib.util.find_spec("absl") is None:  # JAX's Mosaic GPU ops import absl
        yield
        return
    from jax.experimental.pallas.ops.gpu import attention_mgpu as jax_attention

    saved = jax_attention.cuda_versions
    if saved is None or not _cuda_answers(saved):
        jax_attention.cuda_versions = types.SimpleNamespace(cuda_runtime_get_version=lambda: 13000)
    try:
        yield
    finally:
        jax_attention.cuda_versions = saved


def _cuda_answers(versions) -> bool:
    try:
        versions.cuda_runtime_get_version()
    except Exception:  # no CUDA runtime here
        return False
    return True


def lowering_configs(kernel, platform: str, sample: int = 3) -> list[dict]:
    """The configurations a check lowers for `platform` at the kernel's example: its default
    (adapted to the call) and a spread of the others the constraints admit."""
    args, static = example_call(kernel)
    spec = kernel.spec
    device = DeviceInfo(platform, backends.of_platform(platform).default_kind, "", "", "", "")
    sig = spec.signature(args, static, device)
    admitted = spec.space(platform).valid_configs(sig)
    assert admitted, f"{spec.name}: the {platform} space admits nothing at {sig.text}"
    spread = [admitted[i * len(admitted) // sample] for i in range(min(sample, len(admitted)))]
    configs = [spec.default_config(sig)]
    return configs + [c for c in spread if c not in configs]


def example_inputs(kernel) -> tuple[list, dict]:
    """Random arrays of the kernel's example (away from zero: norms divide by them), its
    integer data arguments (group sizes) made by its default workload, and its static
    arguments."""
    from autotune.measure.inputs import task_inputs

    arrays, static = example_call(kernel)
    made = task_inputs(kernel.spec, arrays)
    return [
        made[i]
        if not jnp.issubdtype(a.dtype, jnp.floating)
        else rand(a.shape, a.dtype, seed=i, scale=2.0) + 0.5
        for i, a in enumerate(arrays)
    ], static


def loss(fn, cotangent):
    """A scalar whose gradient is the VJP of `fn` with `cotangent`."""
    return lambda *args: jnp.sum(fn(*args).astype(jnp.float32) * cotangent)


def check_gradient(kernel) -> None:
    """The kernel's gradient at its example (every array differentiated) against its
    reference's, under jax.jit in interpret mode, and the kernels the gradient's program calls:
    the kernel and those it declares (`backward`), each under its own key. A Mosaic GPU kernel
    (GPU interpret mode simulates the GPU: too slow here, and jax 0.10.2's cannot run JAX's
    attention) is traced and lowered for a GPU, forward and backward, instead of run."""
    from autotune.backends import lowering_for
    from autotune.runtime.calls import calls_in

    spec = kernel.spec
    args, static = example_inputs(kernel)
    reference = functools.partial(spec.reference, **static)
    cotangent = rand(jax.eval_shape(reference, *args).shape, seed=9)
    # the float arrays: integer ones (group sizes) are data, with no gradient
    argnums = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))
    if not runs_here(kernel):
        fn = functools.partial(kernel, **static, interpret=False)
        grad = jax.grad(loss(fn, cotangent), argnums)
        with cuda_runtime_stub(), lowering_for("gpu"):
            jax.jit(grad).trace(*args).lower(lowering_platforms=("cuda",))
            called = {c.kernel for c in calls_in(grad, args)}
    else:
        grad = jax.value_and_grad(loss(functools.partial(kernel, **static), cotangent), argnums)
        value, grads = jax.jit(grad)(*args)
        ref_grad = jax.value_and_grad(loss(reference, cotangent), argnums)
        ref_value, ref_grads = jax.jit(ref_grad)(*args)  # one compile, not one an operation
        close(value, ref_value, jnp.float32)
        for g, r in zip(grads, ref_grads):
            close(g, r, jnp.float32)
        called = {c.kernel for c in calls_in(grad, args)}
    assert called == {spec.name, *spec.backward}


def lowering_failures(kernel, platform: str) -> dict[str, str]:
    """The configurations of `lowering_configs` that do not lower for `platform` at the
    kernel's example, each with why (empty: all lower)."""
    from autotune.measure.lowering import lowering_error

    args, static = example_call(kernel)
    with cuda_runtime_stub():
        return {
            str(c): error
            for c in lowering_configs(kernel, platform)
            if (error := lowering_error(kernel, c, args, static, platform)) is not None
        }
