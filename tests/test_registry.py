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

    def modules(kernel):  # the kernel's own statements (an outside import is module "")
        parts = kernel_code(kernel.spec.fn)
        return {name.removeprefix("autotune.kernels.") for name, _ in parts if name}

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


# The tutorial's kernel, as a user writes it in a module of their own (no JAX needed to hash it)
TUTORIAL = textwrap.dedent(
    """
    from autotune import autotuned

    BLOCKS = [8, 16, 32, 64]


    def rows_divide(config, sig):
        return sig.shapes[0][0] % config["block_rows"] == 0


    def double(x):
        return x * 2.0


    @autotuned(name="{name}", space={{"block_rows": BLOCKS}}, constraints=[rows_divide])
    def scale_rows(x, *, block_rows=8):
        return double(x)
    """
)


def test_the_same_kernel_has_one_version_in_a_script_and_in_a_module(tmp_path, monkeypatch):
    import subprocess

    kernel = TUTORIAL.format(name="tutorial_scale")
    (tmp_path / "tutorial_mod.py").write_text(kernel)
    # the script runs the kernel's module as __main__, with code of its own around it: an `x`
    # at the top (the kernel's parameter is another x), a constant nothing reads
    (tmp_path / "script.py").write_text(
        kernel + "\nx = 3.0\nUNRELATED_CONSTANT = 3\nprint(scale_rows.spec.version)\n"
    )
    script = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert script.returncode == 0, script.stderr
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("tutorial_mod")
    monkeypatch.delitem(sys.modules, "tutorial_mod")
    assert script.stdout.strip() == module.scale_rows.spec.version


def test_autotune_kernels_shows_a_version_that_only_the_kernels_own_code_changes(
    tmp_path, monkeypatch, capsys
):
    from autotune.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # each import reads the file again
    path = tmp_path / "versioned_user.py"

    def version(text: str) -> str:
        path.write_text(text)
        sys.modules.pop("versioned_user", None)
        importlib.invalidate_caches()
        assert main(["kernels", "--import", "versioned_user"]) == 0
        (row,) = [r for r in capsys.readouterr().out.splitlines() if "versioned_user" in r]
        return row.split()[1]

    source = TUTORIAL.format(name="versioned_user")
    try:
        before = version(source)
        assert version(source + "\nUNRELATED_CONSTANT = 3\n") == before
        assert version(source + "\ndef unrelated():\n    return 1\n") == before
        assert version(source.replace("x * 2.0", "x * 2.5")) != before  # a helper it calls
        assert version(source.replace("return double(x)", "return double(x) + 0")) != before
        assert version(source.replace("BLOCKS = [8, 16, 32, 64]", "BLOCKS = [8]")) != before
    finally:
        sys.modules.pop("versioned_user", None)


# A kernel in a package of its own inside a package of kernels (kernels/flash_attention/ as
# the shipped kernels are laid out): its code reaches the package's other modules
KERNEL_PACKAGE = {
    "kpkg/__init__.py": "",
    "kpkg/common.py": "SCALE = 2.0\n\n\ndef helper(x):\n    return x * SCALE\n\n\nUNUSED = 1\n",
    "kpkg/attn/__init__.py": "from kpkg.attn.kernel import attn\n",
    "kpkg/attn/blocks.py": "BLOCK = 8\n",
    "kpkg/attn/kernel.py": (
        "from autotune import autotuned\nfrom kpkg import common\n\nfrom .blocks import BLOCK\n\n"
        '\n@autotuned(name="versioned_attn", space={"block": [8, 16]})\n'
        "def attn(x, *, block=BLOCK):\n    return common.helper(x)\n"
    ),
}


def test_a_kernel_in_a_package_of_its_own_reaches_the_modules_of_its_package(tmp_path):
    def version(**edits: tuple[str, str]) -> str:
        root = tmp_path / f"load{len(list(tmp_path.iterdir()))}"
        for name, text in KERNEL_PACKAGE.items():
            old, new = edits.get(Path(name).stem, ("", ""))
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text.replace(old, new) if old else text)
        sys.path.insert(0, str(root))
        try:
            importlib.invalidate_caches()
            return importlib.import_module("kpkg.attn").attn.spec.version
        finally:
            sys.path.remove(str(root))
            for name in [n for n in sys.modules if n == "kpkg" or n.startswith("kpkg.")]:
                del sys.modules[name]

    before = version()
    assert version(common=("UNUSED = 1", "UNUSED = 2")) == before
    assert version(common=("SCALE = 2.0", "SCALE = 3.0")) != before  # read by the helper
    assert version(blocks=("BLOCK = 8", "BLOCK = 16")) != before  # the default block size


def test_a_shape_tuned_for_another_kernel_version_says_so_in_explain_and_a_warning(db_url, caplog):
    import logging

    import jax.numpy as jnp

    from autotune import TuningDB
    from autotune.signature import TuningKey
    from autotune.trial import BestEntry

    @autotuned(name="versioned_declared_stale", space={"block": [8, 16]}, version="v2")
    def declared(x, *, block=8):
        return x

    @autotuned(name="versioned_hashed_stale", space={"block": [8, 16]})
    def hashed(x, *, block=8):
        return x

    x = jnp.ones((8, 128))
    with TuningDB(db_url) as db:
        for kernel in (declared, hashed):
            key = {**kernel.explain(x)["key"], "kernel_version": "v1"}
            db.put_best(TuningKey(**key), BestEntry({"block": 16}, 1e-3, 1, "run", "grid"))
    detail = declared.explain(x)["detail"]
    assert "was tuned for a different version of the kernel (v1, this one is v2" in detail
    assert "its declared version changed (version='v2')" in detail
    assert "its code, space or constraints changed" in hashed.explain(x)["detail"]
    with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
        declared(x)
    (warning,) = [r.getMessage() for r in caplog.records if "versioned_declared" in r.getMessage()]
    assert "a different version of the kernel" in warning and "not served: re-tune it" in warning
    assert "older" not in warning


# ------------------------------------------------------------ block sizes, declared once

BLOCKS_KERNEL = """
import dataclasses

from autotune import Example, autotuned


@dataclasses.dataclass(frozen={frozen})
class BlockSizes:
    block_rows: int = {default}
    num_warps: int = 4


def fits(config, sig):
    return config[{read!r}] <= sig.shapes[0][0]


@autotuned(name="blocked", space={space}, constraints=[fits], example=Example("f32[32,128]"))
def blocked(x, *, block_sizes: BlockSizes = BlockSizes(), interpret=False):
    return x * block_sizes.block_rows
"""
SPACE = {"common": {"block_rows": [8, 16]}, "gpu": {"num_warps": [4, 8]}}


def load_blocks(tmp_path, space=SPACE, default=8, read="block_rows", frozen=True):
    n = len(list(tmp_path.iterdir()))
    path = tmp_path / f"blocked_{n}.py"
    path.write_text(BLOCKS_KERNEL.format(space=space, default=default, read=read, frozen=frozen))
    spec = importlib.util.spec_from_file_location(f"blocked_{n}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_block_sizes_are_the_tunables_and_their_defaults(tmp_path):
    module = load_blocks(tmp_path)
    spec = module.blocked.spec
    assert spec.block_sizes is module.BlockSizes
    assert spec.defaults == {"block_rows": 8, "num_warps": 4}
    assert spec.kernel_kwargs({"block_rows": 16}) == {"block_sizes": module.BlockSizes(16, 4)}
    # the constraints see every field, those this platform does not tune at their defaults
    sig = spec.example.signature("cpu", "cpu")
    assert spec.space("cpu").fixed == (("num_warps", 4),)
    assert spec.space("cpu").is_valid({"block_rows": 16}, sig)


@pytest.mark.parametrize(
    "change, error",
    [
        # a parameter the space tunes and the dataclass lacks
        (
            dict(space={**SPACE, "cpu": {"num_wraps": [2]}}),
            r"blocked tunes 'num_wraps' \(on cpu\), which BlockSizes has no field for: add "
            r"`num_wraps: int = \.\.\.` to BlockSizes",
        ),
        # a field the space gives no candidates
        (
            dict(space={"block_rows": [8, 16]}),
            r"blocked: BlockSizes.num_warps has no candidates in .*: give it a list there",
        ),
        # a default that is not one of its candidates where the platform tunes it
        (
            dict(default=12),
            r"blocked: BlockSizes.block_rows defaults to 12, which is not one of its cpu "
            r"candidates .* \[8, 16\]: add it there, or change the default",
        ),
        # a constraint that reads a parameter the dataclass lacks (asked at the example)
        (
            dict(read="block_row"),
            r"blocked: constraint fits reads parameter 'block_row', which BlockSizes has no "
            r"field for",
        ),
        (dict(frozen=False), r"blocked: BlockSizes is not frozen: declare it"),
    ],
)
def test_a_mismatch_of_block_sizes_space_and_constraints_fails_at_import(tmp_path, change, error):
    from autotune.errors import AutotuneError

    with pytest.raises(AutotuneError, match=error):
        load_blocks(tmp_path, **change)


def test_a_call_gives_block_sizes_by_name_or_whole(tmp_path, db_url):
    import jax.numpy as jnp

    module = load_blocks(tmp_path)
    x = jnp.ones((32, 128))
    assert float(module.blocked(x)[0, 0]) == 8  # the default
    assert float(module.blocked(x, block_rows=16)[0, 0]) == 16
    assert float(module.blocked(x, block_sizes=module.BlockSizes(16))[0, 0]) == 16
    assert module.blocked.explain(x, block_sizes=module.BlockSizes(16))["source"] == "caller"
    with pytest.raises(KernelError, match="block_sizes=.* is no BlockSizes"):
        module.blocked(x, block_sizes=(16, 4))


def test_an_unknown_option_is_named():
    with pytest.raises(
        KernelError, match=r"unknown option\(s\) spcae; no space: it takes name, space"
    ):
        autotuned(name="typo", spcae={"block": [8]})


def test_every_shipped_kernel_declares_its_block_sizes_an_example_and_its_backward():
    # what the suites that cover every kernel read (tests/kernel_checks.py): every kernel
    # differentiates but the backward kernels, which its gradient calls
    from autotune import registry
    from autotune.registry.version import SHIPPED_KERNELS_PACKAGE
    from autotune.runtime.variants import VariantGroup

    shipped = {
        n: k.spec
        for n, k in registry.registered().items()
        if k.spec.fn.__module__.startswith(SHIPPED_KERNELS_PACKAGE + ".")
        and not isinstance(k, VariantGroup)
    }
    assert len(shipped) >= 15
    assert all(s.block_sizes is not None for s in shipped.values())
    assert all(s.example is not None for s in shipped.values())
    called = {b for s in shipped.values() for b in s.backward or ()}
    assert called <= set(shipped)
    # serving kernels JAX gives no gradient (ragged paged attention) stand apart
    serving = {"ragged_paged_attention", "decode_attention", "paged_attention_gpu"}
    assert {n for n, s in shipped.items() if not s.differentiates} - serving == called - {
        n for n, s in shipped.items() if s.differentiates
    }
    assert {"attention_mgpu", "flash_attention"} <= {
        n for n, s in shipped.items() if s.differentiates
    }
