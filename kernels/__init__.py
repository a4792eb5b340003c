"""The Pallas kernels shipped with pallas-autotune: one package per op, each holding its kernels
(forward and backward, their TPU and GPU bodies, VJP, block sizes and references), and the
variant groups over them (groups.py).

Importing this package imports every package in it, which registers its kernels by name
(@autotuned), and makes what each exports (its `__all__`: kernels and references) an attribute
of this one (`from autotune.kernels import matmul`). A new op's package is found here by its
folder; the one line it needs elsewhere is its name in pyproject.toml's `packages`, which
installs it (README, "Adding a kernel"). Each kernel reads the tuned tables shipped in tuned/
(`tuned="../tuned"`: `autotune db export` files, one per hardware check; see tuned/README.md),
which serve the calls a user's database has no entry for.
"""

import importlib
import pkgutil

__all__: list[str] = []
for _op in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg):
    _package = importlib.import_module(f"{__name__}.{_op}")
    globals().update({name: getattr(_package, name) for name in _package.__all__})
    __all__ += _package.__all__
del _op, _package

from autotune.kernels.groups import attention_variants, matmul_variants, ragged_dot  # noqa: E402

__all__ += ["attention_variants", "matmul_variants", "ragged_dot"]
