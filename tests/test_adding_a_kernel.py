"""The README's "Adding a kernel", done as it says: its files written into a package of this
test's own, the kernel found by every enumeration of the suites that cover every kernel (from
the registry, nothing else naming it), its checks there passing, and the kernel tuned and
served."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest
from kernel_checks import (
    backward_kernels,
    check_gradient,
    close,
    differentiable,
    lowering_failures,
    lowers_for,
    outermost,
    rand,
    with_examples,
)

import autotune
from autotune import registry

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
PACKAGE = "added_kernels"  # plays autotune.kernels


def section() -> list[tuple[str, str]]:
    """(language, code) of each block of the README's "Adding a kernel", in order."""
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Adding a kernel\n")
    body = text[start : text.index("\n## ", start + 1)]
    return FENCE.findall(body)


@pytest.fixture
def added(tmp_path, monkeypatch):
    """The README's files in a package of this test's own, imported as kernels/__init__.py
    imports a package of its folder; the registry as it was afterwards."""
    (module, init, toml, line, tests) = section()
    assert [lang for lang, _ in (module, init, toml, line, tests)] == [
        "python",
        "python",
        "toml",
        "",
        "python",
    ]
    # the registration line is one of pyproject.toml's packages, as each shipped package's is
    listed = (ROOT / "pyproject.toml").read_text()
    assert re.fullmatch(r'\s*"autotune\.kernels\.scale_rows",\s*', line[1])
    assert '    "autotune.kernels.matmul",\n' in listed
    ours = tmp_path / PACKAGE
    op = ours / "scale_rows"
    (op / "search_spaces").mkdir(parents=True)  # a space by name is found beside its module
    (ours / "tuned").mkdir()
    (ours / "__init__.py").write_text("")
    (op / "scale_rows.py").write_text(module[1])
    (op / "__init__.py").write_text(init[1].replace("autotune.kernels.", f"{PACKAGE}."))
    (op / "search_spaces" / "scale_rows.toml").write_text(toml[1])
    (tmp_path / "test_scale_rows.py").write_text(
        tests[1].replace("autotune.kernels", f"{PACKAGE}.scale_rows")
    )
    registry.registered()  # the shipped kernels in it first: registered after, they would be lost
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module(f"{PACKAGE}.scale_rows")
        yield tmp_path
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in (PACKAGE, "test_scale_rows")]:
            del sys.modules[name]


@pytest.fixture
def hardware_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import hardware_check
        import tune_kernels

        yield hardware_check, tune_kernels
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_a_kernel_added_as_the_readme_says_is_found_checked_tuned_and_served(
    added, hardware_check, db_url
):
    kernel = registry.resolve("scale_rows")
    assert kernel.spec.fn.__module__ == f"{PACKAGE}.scale_rows.scale_rows"
    # every enumeration of the suites that cover every kernel finds it
    assert "scale_rows" in with_examples() and "scale_rows" in differentiable()
    assert "scale_rows" in outermost() and "scale_rows" not in backward_kernels()
    assert lowers_for(kernel, "tpu") and lowers_for(kernel, "gpu")
    hc, tune_kernels = hardware_check
    (case,) = [c for c in hc.registered_cases() if c.kernel == "scale_rows"]
    assert case.shapes == ((32, 128),) and case.dtype == "float32"
    plan = hc.steps([case], hc.ALL_DTYPES, smoke=True, overheads=hc.overheads_of("cpu"))
    assert [(s.label, s.checks, s.tuned) for s in plan] == [
        ("scale_rows float32", ("float32",), True)
    ]
    assert "scale_rows" in [name for name, _, _ in tune_kernels.cases(True, "float32")]
    # and what each does with it passes: its gradient (and the kernels it calls), its
    # lowering for a TPU and a GPU, its own tests
    check_gradient(kernel)
    assert lowering_failures(kernel, "tpu") == {}
    assert lowering_failures(kernel, "gpu") == {}
    own = importlib.import_module("test_scale_rows")
    own.test_scale_rows_matches_its_reference_at_every_block()
    # it tunes, and the call is served what was tuned
    x = rand((32, 128))
    result = autotune.tune(kernel, [x], n_trials=2, finalists=0, db=db_url, seed=0)
    assert kernel.explain(x)["source"] == "db"
    assert kernel.explain(x)["config"] == result.best_config
    close(kernel(x), x * 3.0, jnp.float32)
