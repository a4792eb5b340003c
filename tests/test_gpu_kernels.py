"""JAX's GPU kernels registered unedited (Triton attention, decode attention, paged attention,
the Hopper ragged_dot_mgpu) and our Triton grouped matmul, checked without a GPU: their
outputs in interpret mode against JAX's references on their workloads, their candidates
lowered for a GPU, and the variant groups they join on a GPU. (Their gradients, and their
examples' lowering, are checked with every kernel's: tests/test_gradients.py,
tests/test_triton_check.py.) Nothing here times them: there is no GPU on this host."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_checks import lowering_failures

from autotune.device import DeviceInfo
from autotune.kernels import gpu_attention

if not gpu_attention.JAX_HAS_THEM:
    pytest.skip(f"JAX {jax.__version__} ships no Triton attention ops", allow_module_level=True)

from autotune.kernels import (  # noqa: E402
    attention_variants,
    decode_attention,
    decode_attention_reference,
    paged_attention_gpu,
    paged_attention_gpu_reference,
    ragged_dot,
    ragged_dot_mgpu,
)
from autotune.measure.inputs import task_inputs  # noqa: E402

A100 = DeviceInfo("gpu", "NVIDIA A100-SXM4-80GB", "triton", "", "", "")
H100 = DeviceInfo("gpu", "NVIDIA H100 80GB HBM3", "triton", "", "", "")


@pytest.mark.parametrize("workload", ["full", "ragged"])
@pytest.mark.parametrize(
    "kernel, reference",
    [
        (decode_attention, decode_attention_reference),
        (paged_attention_gpu, paged_attention_gpu_reference),
    ],
    ids=["decode_attention", "paged_attention_gpu"],
)
def test_decode_kernels_match_jaxs_references_in_interpret_mode(kernel, reference, workload):
    args = task_inputs(kernel.spec, kernel.spec.example.arrays(), seed=4, workload=workload)
    lengths = np.asarray(args[-1])
    assert lengths.min() >= 1 and (workload == "ragged") == (len(set(lengths.tolist())) > 1)
    out = jax.jit(lambda *a: kernel(*a, interpret=True))(*args)
    expected = reference(*args)
    assert float(jnp.abs(out - expected).max()) <= 1e-5 * float(jnp.abs(expected).max())


def test_ragged_dot_mgpus_admitted_candidates_lower_for_a_hopper_gpu():
    assert lowering_failures(ragged_dot_mgpu, "gpu") == {}


def test_the_gpu_members_join_their_groups_on_a_gpu():
    qkv = [jax.ShapeDtypeStruct((1, 2, 64, 64), jnp.float16)] * 3
    on_a100 = [m.name for m in attention_variants.runnable(qkv, {}, A100)[0]]
    assert "triton_attention" in on_a100 and "splash_attention" not in on_a100
    assert "attention_mgpu" not in on_a100
    gmm = [
        jax.ShapeDtypeStruct((256, 128), jnp.float16),
        jax.ShapeDtypeStruct((4, 128, 256), jnp.float16),
        jax.ShapeDtypeStruct((4,), jnp.int32),
    ]
    assert [m.name for m in ragged_dot.runnable(gmm, {}, A100)[0]] == ["grouped_matmul", "xla"]
    assert [m.name for m in ragged_dot.runnable(gmm, {}, H100)[0]] == [
        "ragged_dot_mgpu",
        "grouped_matmul",
        "xla",
    ]
