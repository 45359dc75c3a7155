"""AIConfigurator's GEMM tables: the reader, its drops and errors, and the roofline shares."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bayes_latency.data.kernels import (
    ALLREDUCE_COLUMNS,
    GEMM_COLUMNS,
    allreduce_coefficient,
    kernel_data_root,
    read_allreduce_tables,
    read_gemm_tables,
    roofline_efficiency,
)
from bayes_latency.errors import BayesLatencyError, TraceFormatError
from bayes_latency.physics.hardware import load_gpu

H100 = load_gpu("H100")


def _write(root, system: str, version: str, rows: list[dict], drop: str | None = None) -> None:
    d = root / system / "gemm" / "vllm" / version
    d.mkdir(parents=True)
    df = pd.DataFrame([{"framework": "VLLM", "version": version, "device": "x", "op_name": "gemm",
                        "kernel_source": "linear", **r} for r in rows])
    if drop:
        df = df.drop(columns=[drop])
    df.to_parquet(d / "gemm_perf.parquet")


def _gemm(m: int, n: int, k: int, share: float, bound: str) -> dict:
    """A bf16 GEMM on the H100 whose measured latency is its datasheet time over ``share``."""
    t_c = 2.0 * m * n * k / H100.peak_flops_bf16
    t_m = (m * k + k * n + m * n) * 2.0 / H100.hbm_bandwidth
    return {"gemm_dtype": "bfloat16", "m": m, "n": n, "k": k,
            "latency": (t_c if bound == "compute" else t_m) / share * 1e3}


def test_reader_takes_the_newest_version_computes_the_roofline_and_counts_drops(tmp_path):
    _write(tmp_path, "h100_sxm", "0.9.0", [_gemm(8192, 8192, 8192, 0.5, "compute")])
    _write(tmp_path, "h100_sxm", "0.10.0", [
        _gemm(8192, 8192, 8192, 0.8, "compute"), _gemm(16384, 8192, 8192, 0.7, "compute"),
        _gemm(1, 16384, 16384, 0.9, "memory"), _gemm(4, 16384, 16384, 0.85, "memory"),
        {**_gemm(8192, 8192, 8192, 0.8, "compute"), "latency": float("nan")},
        {**_gemm(8192, 8192, 8192, 0.8, "compute"), "latency": -1.0},
        {**_gemm(8192, 8192, 8192, 0.8, "compute"), "gemm_dtype": "int4"},
    ])
    t = read_gemm_tables(tmp_path)
    assert [p.parent.name for p in t.files] == ["0.10.0"]
    assert list(t.table.columns) == list(GEMM_COLUMNS) and len(t.table) == 4
    assert t.dropped == {"non-finite or non-positive shape or latency": 2,
                         "dtype without a known width": 1}
    first = t.table.iloc[0]
    assert first["gpu"] == "H100-SXM"
    assert first["flops"] == pytest.approx(2.0 * 8192**3, rel=1e-12)
    assert first["t_compute_us"] == pytest.approx(2.0 * 8192**3 / H100.peak_flops_bf16 * 1e6,
                                                  rel=1e-12)
    eff = roofline_efficiency(t.table).loc[("H100-SXM", "bfloat16")]
    assert eff["compute_eff"] == pytest.approx(0.75, rel=1e-9)  # median of 0.8 and 0.7
    assert eff["memory_eff"] == pytest.approx(0.875, rel=1e-9)
    assert eff["n_compute"] == 2 and eff["n_memory"] == 2


def test_small_gemms_are_left_out_of_the_shares(tmp_path):
    _write(tmp_path, "h100_sxm", "1.0", [_gemm(64, 64, 64, 0.1, "compute"),
                                         _gemm(1, 1024, 1024, 0.1, "memory"),
                                         _gemm(8192, 8192, 8192, 0.8, "compute")])
    eff = roofline_efficiency(read_gemm_tables(tmp_path).table).loc[("H100-SXM", "bfloat16")]
    assert eff["n_compute"] == 1 and eff["n_memory"] == 0 and np.isnan(eff["memory_eff"])


def test_reader_errors_name_the_file_and_what_is_wrong(tmp_path):
    _write(tmp_path, "l40s", "1.0", [_gemm(8192, 8192, 8192, 0.8, "compute")], drop="latency")
    with pytest.raises(TraceFormatError, match="latency") as e:
        read_gemm_tables(tmp_path)
    assert "gemm_perf.parquet" in str(e.value)
    with pytest.raises(BayesLatencyError, match="no datasheet"):
        read_gemm_tables(tmp_path, systems=("tpu_v9",))
    with pytest.raises(BayesLatencyError, match="no sglang GEMM table"):
        read_gemm_tables(tmp_path, framework="sglang")


@pytest.mark.skipif(kernel_data_root() is None, reason="aiconfigurator-core is not installed")
def test_the_installed_tables_give_plausible_shares_on_every_gpu():
    t = read_gemm_tables()
    eff = roofline_efficiency(t.table)
    for gpu in ("A100-80GB", "H100-SXM", "H200-SXM", "L40S"):
        r = eff.loc[(gpu, "bfloat16")]
        assert 0.3 < r["compute_eff"] <= 1.0 and r["n_compute"] >= 100, (gpu, r)
        assert 0.3 < r["memory_eff"] <= 1.0 and r["n_memory"] >= 100, (gpu, r)


def _write_nccl(root, system: str, version: str, rows: list[dict], drop: str | None = None) -> None:
    d = root / system / "comm" / "nccl" / version
    d.mkdir(parents=True)
    df = pd.DataFrame([{"framework": "TRTLLM", "version": version, "device": "x",
                        "kernel_source": "NCCL", **r} for r in rows])
    if drop:
        df = df.drop(columns=[drop])
    df.to_parquet(d / "nccl_perf.parquet")


def _allreduce(tp: int, elems: int, coef: float, call_us: float, dtype: str = "half") -> dict:
    """An H100 all-reduce whose latency is ``call_us`` plus ``coef`` times BLIS's feature."""
    feature_us = elems * 2.0 * 2.0 * (tp - 1) / tp / H100.blis.bytes_per_us
    return {"op_name": "all_reduce", "nccl_dtype": dtype, "num_gpus": tp, "message_size": elems,
            "latency": (call_us + coef * feature_us) / 1e3}


def test_allreduce_tables_give_blis_coefficient_and_per_call_time(tmp_path):
    sizes = [2**k for k in range(16, 28, 2)]  # 64 Ki to 64 Mi half elements (128 KiB-128 MiB)
    _write_nccl(tmp_path, "h100_sxm", "2.20", [_allreduce(2, 2**24, 99.0, 1.0)])
    _write_nccl(tmp_path, "h100_sxm", "2.27.3", [
        *(_allreduce(2, n, 10.0, 40.0) for n in sizes),
        *(_allreduce(8, n, 7.0, 60.0) for n in sizes),
        _allreduce(4, 2**20, 9.0, 30.0, dtype="int8"),  # another dtype: not read
        {**_allreduce(2, 2**20, 10.0, 40.0), "op_name": "all_gather"},  # another op
        {**_allreduce(2, 2**20, 10.0, 40.0), "latency": float("nan")},
        {**_allreduce(2, 2**20, 10.0, 40.0), "num_gpus": 1},
    ])
    t = read_allreduce_tables(tmp_path)
    assert [p.parent.name for p in t.files] == ["2.27.3"]
    assert list(t.table.columns) == list(ALLREDUCE_COLUMNS) and len(t.table) == 2 * len(sizes)
    assert t.dropped == {"non-finite or non-positive size or latency, or fewer than 2 GPUs": 2}
    first = t.table.iloc[0]
    assert first["message_bytes"] == 2.0 * sizes[0]  # message_size counts half elements
    ar = allreduce_coefficient(t.table)
    assert ar.loc[("H100-SXM", 2), "coefficient"] == pytest.approx(10.0, rel=1e-9)
    assert ar.loc[("H100-SXM", 2), "latency_call_us"] == pytest.approx(40.0, rel=1e-9)
    assert ar.loc[("H100-SXM", 8), "coefficient"] == pytest.approx(7.0, rel=1e-9)
    # at small messages the per-call time dominates: latency / feature far above the slope
    assert ar.loc[("H100-SXM", 2), "coef_at_1mib"] > 2 * ar.loc[("H100-SXM", 2), "coef_at_8mib"]
    assert ar.loc[("H100-SXM", 2), "n_bandwidth"] == sum(2 * n >= 2**24 for n in sizes)


def test_allreduce_time_growing_faster_than_bytes_is_a_line_through_zero(tmp_path):
    rows = [_allreduce(8, n, 0.0, 0.0) for n in (2**23, 2**24, 2**25)]
    for r, c in zip(rows, (100.0, 200.0, 600.0), strict=True):
        feature_us = r["message_size"] * 4.0 * 7 / 8 / H100.blis.bytes_per_us
        r["latency"] = c * feature_us / 1e3
    _write_nccl(tmp_path, "h100_sxm", "1.0", rows)
    ar = allreduce_coefficient(read_allreduce_tables(tmp_path).table).loc[("H100-SXM", 8)]
    assert ar["latency_call_us"] == 0.0 and 200.0 < ar["coefficient"] < 600.0


def test_allreduce_reader_errors(tmp_path):
    _write_nccl(tmp_path, "a100_sxm", "1.0", [_allreduce(2, 2**20, 10.0, 40.0)], drop="latency")
    with pytest.raises(TraceFormatError, match="latency") as e:
        read_allreduce_tables(tmp_path)
    assert "nccl_perf.parquet" in str(e.value)
    with pytest.raises(BayesLatencyError, match="no NCCL all-reduce table"):
        read_allreduce_tables(tmp_path, systems=("l40s",))
    with pytest.raises(BayesLatencyError, match="width unknown"):
        read_allreduce_tables(tmp_path, dtype="fp4")
    with pytest.raises(BayesLatencyError, match="no datasheet"):
        read_allreduce_tables(tmp_path, systems=("tpu_v9",))


@pytest.mark.skipif(kernel_data_root() is None, reason="aiconfigurator-core is not installed")
def test_the_installed_allreduce_tables_give_a_coefficient_per_gpu_and_tp():
    ar = allreduce_coefficient(read_allreduce_tables().table)
    for gpu in ("A100-80GB", "H100-SXM", "H200-SXM"):  # NVLink: HBM over bus bandwidth, 3-30
        for tp in (2, 4, 8):
            r = ar.loc[(gpu, tp)]
            assert 3.0 < r["coefficient"] < 30.0 and r["latency_call_us"] >= 0.0, (gpu, tp, r)
            assert r["coef_at_1mib"] > r["coefficient"], (gpu, tp, r)
    assert ar.loc[("L40S", 8), "coefficient"] > ar.loc[("H100-SXM", 8), "coefficient"]  # PCIe
