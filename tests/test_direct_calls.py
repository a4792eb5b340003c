"""Every shipped kernel's repeated eager call goes straight into jit's C++ dispatch: its
signature says how calls split (arrays, then keyword-only options), so no Python of ours runs
per call. The decorator's rule is read here through `_direct`, the flag that picks that path."""

from autotune import autotuned
from autotune.registry import SHIPPED_KERNELS_PACKAGE, registered


def test_every_shipped_kernel_is_called_straight_through_jit():
    shipped = {
        name: kernel
        for name, kernel in registered().items()
        if kernel.spec.fn.__module__.startswith(SHIPPED_KERNELS_PACKAGE + ".")
    }
    assert "flash_attention" in shipped  # sm_scale: float | None = None is an option
    assert sorted(name for name, kernel in shipped.items() if not kernel._direct) == []


def test_a_none_default_that_may_be_an_array_has_each_call_checked():
    @autotuned(name="biased_rows", space={"block_rows": [8]})
    def biased_rows(x, *, bias=None, block_rows=8, interpret=False):
        return x if bias is None else x + bias

    @autotuned(name="scaled_rows", space={"block_rows": [8]})
    def scaled_rows(x, *, scale: float | None = None, block_rows=8, interpret=False):
        return x if scale is None else x * scale

    assert not biased_rows._direct and scaled_rows._direct
