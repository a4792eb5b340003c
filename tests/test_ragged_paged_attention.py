"""JAX's ragged paged attention, registered unedited: its serving batches, its candidates
lowered for a TPU from this CPU host, a refusal to tune where nothing can judge it, and
`autotune db export --format jax`: a module shaped as JAX's tuned_block_sizes.py."""

import importlib
import importlib.util

import jax.numpy as jnp
import numpy as np
import pytest

import autotune
from autotune import TuningDB
from autotune.cli import main
from autotune.device import DeviceInfo
from autotune.errors import KernelError
from autotune.kernels import ragged_paged_attention, ragged_paged_attention_reference
from autotune.measure.inputs import task_inputs
from autotune.measure.lowering import lowering_error
from autotune.trial import BestEntry

ARGS = ragged_paged_attention.spec.example.arrays()
jax_tables = importlib.import_module(
    "jax.experimental.pallas.ops.tpu.ragged_paged_attention.tuned_block_sizes"
)
jax_kernel = importlib.import_module(
    "jax.experimental.pallas.ops.tpu.ragged_paged_attention.kernel"
)


@pytest.mark.parametrize("workload", ["decode", "prefill", "mixed"])
def test_each_workload_is_a_batch_jaxs_reference_agrees_with_ours_on(workload):
    made = task_inputs(ragged_paged_attention.spec, ARGS, seed=3, workload=workload)
    kv_lens, pages, cu_q_lens, num_seqs = (np.asarray(a) for a in made[2:])
    n = int(num_seqs[0])
    q_lens = np.diff(cu_q_lens[: n + 1])
    assert (q_lens <= kv_lens[:n]).all() and cu_q_lens[n] <= ARGS[0].shape[0]
    assert (kv_lens[:n] <= pages.shape[1] * ARGS[1].shape[1]).all()
    assert {"decode": q_lens.max() == 1, "prefill": q_lens.min() > 1}.get(workload, True)
    theirs = np.asarray(jax_kernel.ref_ragged_paged_attention(*made), np.float32)
    ours = np.asarray(ragged_paged_attention_reference(*made), np.float32)
    assert np.abs(ours[: len(theirs)] - theirs).max() <= 2e-2 * np.abs(theirs).max()
    assert not ours[len(theirs) :].any()


def test_admitted_candidates_lower_for_a_tpu_from_this_host():
    spec = ragged_paged_attention.spec
    device = DeviceInfo("tpu", "TPU v6 lite", "mosaic_tpu", "", "", "")
    admitted = spec.space("tpu").valid_configs(spec.signature(ARGS, {}, device))
    assert {c["num_kv_pages_per_block"] for c in admitted} == {1, 2, 4, 8}  # 8 pages a sequence
    for config in (admitted[0], admitted[-1]):
        assert lowering_error(ragged_paged_attention, config, ARGS, {}, "tpu") is None


def test_tuning_it_on_a_cpu_refuses_in_one_line(db_url):
    with pytest.raises(KernelError, match="cannot be tuned here: .* interpret mode cannot run it"):
        autotune.tune(ragged_paged_attention, ARGS, n_trials=1)
    assert TuningDB(db_url).query() == []


def test_db_export_format_jax_writes_the_table_jax_looks_up(db_url, tmp_path, monkeypatch, capsys):
    # an entry as a tuning run on a TPU v6e stores it
    spec = ragged_paged_attention.spec
    device = DeviceInfo("tpu", "TPU v6 lite", "mosaic_tpu", "", "", "")
    key = spec.key(spec.signature(ARGS, {}, device), device)
    config = {"num_kv_pages_per_block": 4, "num_queries_per_block": 16}
    with TuningDB(db_url) as db:
        db.put_best(key, BestEntry(config, 1e-4, 8, "run", "gp"))
    out = tmp_path / "tuned_block_sizes.py"
    argv = ["db", "export", "--format", "jax", "--kernel", "ragged_paged_attention"]
    assert main([*argv, "--db", db_url, "--out", str(out)]) == 0
    module_spec = importlib.util.spec_from_file_location("exported_table", out)
    exported = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(exported)
    ((name, table),) = exported.TUNED_BLOCK_SIZES.items()
    assert name == "TPU v6" and list(table.values()) == [(4, 16)]
    (row,) = table
    # JAX's key order: dtypes, heads per block, head_dim, page size, tokens, max model length
    assert row == ("bfloat16", "bfloat16", 4, 2, 128, 16, 32, 128)
    # JAX's own look-up, on a v6e, finds it in place of its hand-kept table
    monkeypatch.setattr(jax_tables, "TUNED_BLOCK_SIZES", exported.TUNED_BLOCK_SIZES)
    monkeypatch.setattr(jax_tables, "get_tpu_version", lambda: 6)
    monkeypatch.setattr(jax_tables, "get_device_name", lambda: "TPU v6")
    q, kv, _, pages, *_ = ARGS
    assert jax_tables.get_tuned_block_sizes(
        q.dtype, kv.dtype, 4, 2, 128, kv.shape[1], q.shape[0], pages.shape[1]
    ) == (4, 16)


def test_db_export_format_jax_needs_a_kernel_with_a_table_format(db_url, capsys):
    TuningDB(db_url).close()  # created empty
    assert main(["db", "export", "--format", "jax", "--db", db_url]) == 2
    assert "give --kernel NAME" in capsys.readouterr().err
    assert main(["db", "export", "--format", "jax", "--kernel", "matmul", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert "no table format" in err and "ragged_paged_attention" in err


def test_where_its_candidates_run_on_a_tpu_its_reference_judges_them():
    from autotune.measure.oracle import make_oracle

    spec = ragged_paged_attention.spec
    args = task_inputs(spec, ARGS, seed=5, workload="mixed")
    tpu = DeviceInfo("tpu", "TPU v6 lite", "mosaic_tpu", "", "", "")
    oracle = make_oracle(spec, spec.defaults, args, {}, "mosaic_tpu", tpu)
    assert oracle.name == "reference" and oracle.output.dtype == jnp.bfloat16
    expected = np.asarray(ragged_paged_attention_reference(*args), np.float32)
    assert np.array_equal(np.asarray(oracle.output, np.float32), expected)
