"""Tests of the Splitwise microbenchmark reader (bayes_latency.data.microbench)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayes_latency.data.microbench import SPLITWISE_COLUMNS, read_splitwise
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

HEADER = ("model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,"
          "prompt_time,token_time,e2e_time,tensor_parallel")


@pytest.mark.real
def test_real_splitwise(real_dir: Path) -> None:
    p = real_dir / "microbench" / "splitwise_perf_model.csv"
    if not p.exists():
        pytest.skip("splitwise csv absent")
    rep = IngestReport()
    df = read_splitwise(p, report=rep)
    assert list(df.columns) == list(SPLITWISE_COLUMNS)
    cells = set(df[["gpu", "model", "tp"]].itertuples(index=False, name=None))
    # the README's table: a100 llama2-70b TP 2/4/8, a100 bloom-176b TP 8, h100 llama2-70b TP 2/4
    assert cells == {("A100", "llama2-70b", 2), ("A100", "llama2-70b", 4),
                     ("A100", "llama2-70b", 8), ("A100", "bloom-176b", 8),
                     ("H100", "llama2-70b", 2), ("H100", "llama2-70b", 4)}
    assert rep.n_dropped == 0 and len(df) == rep.read["rows"]
    assert set(df["repetition"]) == set(range(5))
    assert (df["repetition"] == 0).sum() == len(df) // 5
    # prompt 512 / batch 1 / 128 tokens is measured in each of the three sweeps of a cell
    sizes = df.groupby(["gpu", "model", "tp", "prompt_size", "batch_size", "token_size"]).size()
    assert set(sizes) == {5, 15}
    # ms -> us: an H100 70B decode step is tens of ms
    tok = df[(df["gpu"] == "H100") & (df["batch_size"] == 1)]["token_time_us"]
    assert tok.between(5_000, 200_000).all()
    assert (df["e2e_time_us"] > df["prompt_time_us"]).all()


def test_constructed_csv(tmp_path: Path) -> None:
    rows = [
        "llama2-70b,a100-80gb,512,1,128,1.0,0.7,196.25,54.8,7168.9,2",
        "llama2-70b,a100-80gb,512,1,128,1.0,0.7,195.5,54.9,7165.2,2",
        "llama2-70b,h100-80gb,512,1,128,1.0,0.7,100.0,30.0,4000.0,2",
        "llama2-70b,h100-80gb,512,1,128,1.0,0.7,-1,30.0,4000.0,2",    # negative time
        "llama2-70b,h100-80gb,512,x,128,1.0,0.7,100,30.0,4000.0,2",   # non-numeric size
        "llama2-70b,h100-80gb,512,1,128,1.0,0.7,100,,4000.0,2",       # missing time
        "llama2-70b,h100-80gb,512,1,128,1.0,0.7,100,30,4000.0,2.5",   # fractional tp
        "llama2-70b,tpu-v9,512,1,128,1.0,0.7,100,30,4000.0,4",        # unknown hardware
    ]
    p = tmp_path / "s.csv"
    p.write_text("\n".join([HEADER] + rows) + "\n")
    rep = IngestReport()
    df = read_splitwise(p, report=rep)
    assert df["gpu"].tolist() == ["A100", "A100", "H100", "tpu-v9"]
    assert df["repetition"].tolist() == [0, 1, 0, 0]
    p.write_text("\n".join([HEADER] + rows[:2] + rows[2:3] + rows[:1]) + "\n")
    assert read_splitwise(p)["repetition"].tolist() == [0, 1, 0, 0]
    assert df["prompt_time_us"].iloc[0] == pytest.approx(196_250.0)
    assert df["token_time_us"].iloc[2] == pytest.approx(30_000.0)
    assert df["tp"].tolist() == [2, 2, 2, 4]
    assert rep.dropped["bad_value:prompt_time"] == 1
    assert rep.dropped["bad_value:batch_size"] == 1
    assert rep.dropped["bad_value:token_time"] == 1
    assert rep.dropped["bad_value:tensor_parallel"] == 1
    assert any("tpu-v9" in n for n in rep.notes)


def test_missing_column_and_unreadable(tmp_path: Path) -> None:
    p = tmp_path / "s.csv"
    p.write_text(HEADER.replace(",token_time", "") + "\n")
    with pytest.raises(TraceFormatError, match="token_time"):
        read_splitwise(p)
    with pytest.raises(TraceFormatError):
        read_splitwise(tmp_path / "absent.csv")
