"""The kernel version: what changes a kernel's meaning changes its version."""

import importlib.util
import sys
import textwrap

WRAPPER = textwrap.dedent(
    """
    from autotune import autotuned

    def body(x):
        return x * {factor}

    @autotuned(name="versioned", space={{"block": [8, 16]}})
    def kernel(x, *, block=8):
        return body(x)
    """
)


def load(tmp_path, n, factor):
    path = tmp_path / f"versioned_{n}.py"
    path.write_text(WRAPPER.format(n=n, factor=factor))
    spec = importlib.util.spec_from_file_location(f"versioned_{n}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would
    spec.loader.exec_module(module)
    return module.kernel.spec.version


def test_a_change_beside_the_wrapper_changes_the_version(tmp_path):
    # same wrapper, same space; only the helper the wrapper calls differs
    assert load(tmp_path, 1, 2) != load(tmp_path, 2, 3)


def test_the_same_source_gives_the_same_version(tmp_path):
    # loading one file twice (two processes, or a reload) must not look like a new kernel
    assert load(tmp_path, 3, 2) == load(tmp_path, 3, 2)
