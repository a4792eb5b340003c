"""The kernel version: what changes a kernel's meaning changes its version."""

import hashlib
import importlib
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from autotune import autotuned
from autotune.errors import KernelError
from autotune.registry.version import kernel_code, normalised

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


def test_code_nested_too_deep_to_normalise_still_has_a_version(tmp_path):
    # a sum of 1000 terms compiles, but is deeper than the syntax tree's dump recurses
    deep = " + ".join(["1"] * 1000)
    assert load(tmp_path, 4, deep) != load(tmp_path, 5, deep + " + 1")


def test_the_same_source_gives_the_same_version(tmp_path):
    # loading one file twice (two processes, or a reload) must not look like a new kernel
    assert load(tmp_path, 3, 2) == load(tmp_path, 3, 2)


# A package whose kernel runs a helper of the same package, loaded under one name each time
PACKAGE_KERNEL = '''
"""A kernel in a package."""
from autotune import autotuned
from verpkg.helpers import body


@autotuned(name="versioned_in_package", space={"block": [8, 16]})
def kernel(x, *, block=8):
    return body(x)
'''
PACKAGE_HELPER = "def body(x):\n    return x * 2\n"


def load_package(tmp_path, kernel=PACKAGE_KERNEL, helper=PACKAGE_HELPER):
    root = tmp_path / f"load{len(list(tmp_path.iterdir()))}"
    (root / "verpkg").mkdir(parents=True)
    (root / "verpkg" / "__init__.py").write_text("")
    (root / "verpkg" / "kernel.py").write_text(kernel)
    (root / "verpkg" / "helpers.py").write_text(helper)
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        return importlib.import_module("verpkg.kernel").kernel.spec.version
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == "verpkg" or n.startswith("verpkg.")]:
            del sys.modules[name]


def test_comments_docstrings_and_formatting_leave_the_version(tmp_path):
    edited = (
        PACKAGE_KERNEL.replace('"""A kernel in a package."""', "# no docstring now")
        .replace("    return body(x)", '    """Doubles x."""\n    return body(  x )  # why')
        .replace("@autotuned(", "@autotuned(  # the space\n    ")
    )
    assert load_package(tmp_path, kernel=edited) == load_package(tmp_path)


def test_a_changed_line_of_a_module_the_kernel_imports_changes_the_version(tmp_path):
    changed = PACKAGE_HELPER.replace("x * 2", "x * 3")
    assert load_package(tmp_path, helper=changed) != load_package(tmp_path)


def test_a_module_outside_any_package_covers_the_modules_beside_it(tmp_path):
    def version(factor):
        root = tmp_path / f"load{factor}"
        root.mkdir()
        (root / "besidekernel.py").write_text(
            PACKAGE_KERNEL.replace("verpkg.helpers", "besidehelpers").replace(
                "versioned_in_package", "versioned_beside"
            )
        )
        (root / "besidehelpers.py").write_text(PACKAGE_HELPER.replace("2", str(factor)))
        sys.path.insert(0, str(root))
        try:
            importlib.invalidate_caches()
            return importlib.import_module("besidekernel").kernel.spec.version
        finally:
            sys.path.remove(str(root))
            for name in ("besidekernel", "besidehelpers"):
                sys.modules.pop(name, None)

    assert version(2) != version(3)


def test_the_shipped_kernels_versions_cover_the_modules_they_run_and_no_other_ops():
    from autotune.kernels import attention_mgpu, bmm, flash_attention_dq, matmul, softmax

    def modules(kernel):
        return {name.removeprefix("autotune.kernels.") for name, _ in kernel_code(kernel.spec.fn)}

    # an op's modules and the helpers the ops share, and no package's __init__ (which imports
    # every op of its package)
    assert modules(softmax) == {"rows.softmax", "rows.layout", "differentiable"}
    assert modules(bmm) == {"matmul.bmm", "matmul.tiles", "precision", "differentiable"}
    assert modules(matmul) == {"matmul.matmul", "matmul.tiles", "precision", "differentiable"}
    assert "flash_attention.tpu" in modules(flash_attention_dq)
    assert "flash_attention.forward" not in modules(flash_attention_dq)
    assert "flash_attention.reference" in modules(attention_mgpu)
    assert "flash_attention.backward" not in modules(attention_mgpu)
    # the library and JAX are not the kernel's code: their releases stale nothing
    assert not any(m.startswith(("jax", "autotune.backends")) for m in modules(softmax))


def test_a_comment_in_the_shipped_softmax_leaves_its_code_unchanged():
    from autotune.kernels import softmax

    path = Path(sys.modules[softmax.spec.fn.__module__].__file__)
    source = path.read_text()
    commented = source.replace("\nimport ", "\n# a comment\nimport ", 1) + "\n# the end\n"
    assert commented != source
    assert normalised(commented) == normalised(source)
    assert normalised(source.replace("jnp.", "jax.numpy.", 1)) != normalised(source)


def test_the_normalised_code_is_the_same_on_every_python():
    # pinned: CI runs this file on Python 3.11 and 3.12 (ast.dump differs between them)
    source = textwrap.dedent(
        '''
        """Module doc."""
        import functools


        @functools.cache
        async def f(a: int, /, b=1.5, *args, c: str = f"{1!r:>3}", **kw) -> None:
            """Doc."""
            match a:
                case [x, *_] if x:
                    return [y async for y in b]
            x: dict[str, int] = {"k": (lambda v=None: v)()}
            try:
                del x
            except* ValueError:
                pass


        class C(Exception, metaclass=type):
            "Doc."
            z = ...
        '''
    )
    assert hashlib.sha256(normalised(source).encode()).hexdigest()[:16] == "a2542123a956bca9"


def test_a_declared_version_is_the_version():
    @autotuned(name="versioned_declared", space={"block": [8, 16]}, version="mylib-1.2")
    def kernel(x, *, block=8):
        return x

    assert kernel.spec.version == "mylib-1.2"
    with pytest.raises(KernelError, match="version=''"):
        autotuned(name="versioned_declared", space={"block": [8]}, version="")(kernel.spec.fn)
