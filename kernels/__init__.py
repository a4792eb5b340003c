"""The Pallas kernels shipped with pallas-autotune: one package per op, each holding its kernels
(forward and backward, their TPU and GPU bodies, VJP, block sizes and references), registered
by name (@autotuned) when it is imported, and the variant groups over them (groups.py).

A line below per package registers its kernels (README, "Adding a kernel"). Each kernel reads
the tuned tables shipped in tuned/ (`tuned="../tuned"`: `autotune db export` files, one per
hardware check; see tuned/README.md), which serve the calls a user's database has no entry for.
"""

from autotune.kernels.attention_mgpu import *  # noqa: F403
from autotune.kernels.flash_attention import *  # noqa: F403
from autotune.kernels.groups import *  # noqa: F403
from autotune.kernels.matmul import *  # noqa: F403
from autotune.kernels.matmul_mgpu import *  # noqa: F403
from autotune.kernels.rows import *  # noqa: F403
from autotune.kernels.vector_add import *  # noqa: F403
