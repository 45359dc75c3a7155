"""GPU datasheets and name resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayes_latency.errors import ConfigError, UnknownGPUError
from bayes_latency.physics.hardware import known_gpus, load_gpu


def test_h100_datasheet_and_aliases() -> None:
    g = load_gpu("H100")
    assert g.name == "H100-SXM"
    assert (g.peak_flops_bf16, g.peak_flops_fp8, g.hbm_bandwidth) == (989e12, 1979e12, 3.35e12)
    assert (g.interconnect_bandwidth, g.sm_count) == (450e9, 132)
    assert g.memory_bytes == pytest.approx(80 * 2**30, rel=0.02)
    for alias in ("h100", "h100-80gb", "H100-SXM", "h100_sxm"):
        assert load_gpu(alias) is g


def test_a100_has_no_fp8() -> None:
    g = load_gpu("A100")
    assert g.name == "A100-80GB" and load_gpu("a100-80gb") is g
    assert (g.peak_flops_bf16, g.hbm_bandwidth, g.interconnect_bandwidth, g.sm_count) == \
        (312e12, 2.039e12, 300e9, 108)
    assert g.peak_flops_fp8 is None
    assert g.peak_flops(1) == g.peak_flops(2) == 312e12     # FP8 models run at the bf16 peak
    assert load_gpu("H100").peak_flops(1) == 1979e12


def test_known_gpus() -> None:
    assert {"H100-SXM", "H200-SXM", "A100-80GB", "A100-40GB", "L40S"} <= set(known_gpus())
    assert load_gpu("L40S").interconnect_bandwidth < 100e9      # PCIe, no NVLink


def test_unknown_gpu_lists_known() -> None:
    with pytest.raises(UnknownGPUError, match="H100-SXM.*A100|A100.*H100-SXM"):
        load_gpu("V100")


def test_user_datasheet(tmp_path: Path) -> None:
    f = tmp_path / "mygpu.yaml"
    f.write_text("peak_flops_bf16: 1.0e15\npeak_flops_fp8: 2.0e15\nhbm_bandwidth: 4.0e12\n"
                 "memory_bytes: 1.0e11\ninterconnect_bandwidth: 4.0e11\nsm_count: 100\n")
    g = load_gpu(f)
    assert g.name == "mygpu" and g.hbm_bandwidth == 4e12 and g.peak_flops(1) == 2e15
    nested = tmp_path / "nested.yml"
    nested.write_text("B200:\n  peak_flops_bf16: 2.25e15\n  hbm_bandwidth: 8.0e12\n"
                      "  memory_bytes: 1.9e11\n  interconnect_bandwidth: 9.0e11\n")
    g2 = load_gpu(str(nested))
    assert g2.name == "B200" and g2.peak_flops_fp8 is None and g2.peak_flops(1) == 2.25e15
    bad = tmp_path / "bad.yaml"
    bad.write_text("peak_flops_bf16: 1.0e15\nhbm_bandwidth: -1\nmemory_bytes: 1\ninterconnect_bandwidth: 1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*hbm_bandwidth"):
        load_gpu(bad)
    missing = tmp_path / "missing.yaml"
    missing.write_text("peak_flops_bf16: 1.0e15\nmemory_bytes: 1\ninterconnect_bandwidth: 1\n")
    with pytest.raises(ConfigError, match="hbm_bandwidth"):
        load_gpu(missing)
    with pytest.raises(UnknownGPUError):
        load_gpu(tmp_path / "nope.yaml")
