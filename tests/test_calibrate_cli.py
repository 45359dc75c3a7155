"""``bayes-latency calibrate``: one client result in, coefficients with bands out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from bayes_latency.calibrate.stages import client_stages, default_kv_blocks
from bayes_latency.cli.main import main
from bayes_latency.data.client.read import read_client_results
from bayes_latency.errors import ConfigError
from bayes_latency.synth.client_result import synthetic_vllm_bench

#: True coefficients of the synthetic runs (DEFAULT_TERMS order; BLIS-like magnitudes).
BETA = np.array([0.5, 1.0, 0.5, 1.4, 1.5, 15.0, 30.0, 4.0, 120.0, 0.0, 0.0])
ALPHA = {"alpha_arrival": 15000.0, "alpha_post_decode": 800.0, "alpha_per_token": 40.0}
CFG = ("llama-2-7b", "H100", 1)


def _write(tmp_path: Path, name: str, **kw) -> Path:
    doc = synthetic_vllm_bench(*CFG, BETA, ALPHA, **kw)
    p = tmp_path / name
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def _doc(**kw) -> dict:
    return synthetic_vllm_bench(*CFG, BETA, ALPHA, num_prompts=50, **kw)


def _one_line_error(capsys, argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert needle in err, err


def test_calibrate_end_to_end_and_recovery(tmp_path, capsys):
    """One synthetic vllm-bench JSON (300 requests at 4 req/s, per-request lists) -> posterior,
    history, BLIS export with run-level draws; the calibrated coefficients predict a held-out
    run at twice the load (different lengths) within 20% on mean E2E and TTFT."""
    from bayes_latency.calibrate.loop import config_means
    from bayes_latency.checks.sanity import load_posterior
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture
    from bayes_latency.schedule.replay import predicted_means, replay_stage

    res = _write(tmp_path, "bench.json", rate=4.0, num_prompts=300, seed=1)
    out, exp = tmp_path / "post.nc", tmp_path / "llama.yaml"
    # the roofline priors alone: the synthetic truth is not the real fleet's population
    rc = main(["calibrate", str(res), "--model", "llama-2-7b", "--gpu", "H100", "--tp", "1",
               "--out", str(out), "--export", str(exp), "--population", "none"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert out.is_file() and exp.is_file()
    assert "calibration: " in text and "iteration" in text and "converged" in text
    assert "gates passed" in text
    doc = yaml.safe_load(exp.read_text())
    assert len(doc["draws"]) == 20 and doc["run_level_sigma"]["workload_e2e"] > 0.01
    assert doc["provenance"]["client_result"] == str(res)

    # recovery on a held-out load: the truth's measured means at 8 req/s vs the calibrated replay
    held = synthetic_vllm_bench(*CFG, BETA, ALPHA, rate=8.0, num_prompts=300,
                                prompt_len=(100, 600), output_len=(100, 300), seed=7)
    p2 = tmp_path / "held.json"
    p2.write_text(json.dumps(held))
    tabs, _ = read_client_results(p2)
    kv = default_kv_blocks(*CFG)
    (stage,) = client_stages(tabs, *CFG, kv)
    model = load_posterior(out)
    (beta, alpha), = config_means(model, [stage], DEFAULT_TERMS).values()
    rep = replay_stage(stage, load_architecture("llama-2-7b"), load_gpu("H100"), beta)
    pred = predicted_means(rep, beta, alpha)
    e2e = pred["workload_e2e"] / stage.observed["e2e_mean_us"] - 1
    ttft = pred["workload_ttft"] / stage.observed["ttft_mean_us"] - 1
    print(f"held-out E2E {e2e:+.1%}, TTFT {ttft:+.1%}, alpha_arrival {alpha['alpha_arrival']:.0f}")
    assert abs(e2e) < 0.20 and abs(ttft) < 0.20, (e2e, ttft)
    # the TTFT level (alpha_arrival + alpha_per_token + the prefill steps) is what one run
    # identifies; alpha_arrival alone is within a factor 4 of the truth (the rest is prior)
    assert ALPHA["alpha_arrival"] / 4 < alpha["alpha_arrival"] < 4 * ALPHA["alpha_arrival"]


def test_summary_only_result_gives_a_drawn_stage(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(_doc(detailed=False, rate=5.0)))
    tabs, _ = read_client_results(p)
    (st,) = client_stages(tabs, *CFG, 5000)
    assert st.arrival_s is None and st.rate == 5.0 and st.count == 50
    assert len(st.output_pdf) == 1                   # vLLM's summary has only the mean length
    assert st.observed["ttft_mean_us"] > 0 and st.observed["e2e_mean_us"] > 0


def test_infinite_rate_and_burstiness(tmp_path):
    d = _doc(detailed=False)
    d["request_rate"] = "inf"
    p = tmp_path / "inf.json"
    p.write_text(json.dumps(d))
    (st,) = client_stages(read_client_results(p)[0], *CFG, 5000)
    assert st.arrival_s == (0.0,) * 50
    d = _doc(detailed=False, rate=5.0)
    d["burstiness"] = 0.5
    p.write_text(json.dumps(d))
    (st,) = client_stages(read_client_results(p)[0], *CFG, 5000)
    gaps = np.diff(st.arrival_s)
    assert len(st.arrival_s) == 50 and np.all(gaps >= 0)
    # gamma(shape 0.5): more variable than Poisson (CV^2 = 1 / burstiness = 2)
    assert np.var(gaps) / np.mean(gaps) ** 2 > 1.0


def test_default_kv_blocks_is_blis_formula():
    from bayes_latency.calibrate.stages import model_config_dict
    from bayes_latency.physics.blis import kv_blocks_per_gpu
    from bayes_latency.study.blis.spec import kv_blocks_per_gpu as old_import

    cfg = model_config_dict("llama-2-7b")
    assert default_kv_blocks(*CFG) == kv_blocks_per_gpu(cfg, 1) == old_import(cfg, 1)
    assert default_kv_blocks("llama-2-70b", "H100", 4) > 0
    with pytest.raises(ConfigError, match="does not fit"):
        default_kv_blocks("llama-2-70b", "H100", 1)


def test_closed_loop_without_send_times_is_refused(tmp_path, capsys):
    d = _doc(detailed=False)
    d["max_concurrency"] = 8
    p = tmp_path / "closed.json"
    p.write_text(json.dumps(d))
    _one_line_error(capsys, ["calibrate", str(p), "--model", "llama-2-7b", "--gpu", "H100",
                             "--out", str(tmp_path / "p.nc")], "max_concurrency")
    assert not (tmp_path / "p.nc").exists()


@pytest.mark.parametrize("drop, needle", [
    (("total_input_tokens",), "prompt_len_mean"),
    (("mean_ttft_ms", "mean_e2el_ms", "median_ttft_ms", "median_e2el_ms", "p99_ttft_ms",
      "p99_e2el_ms", "std_ttft_ms", "std_e2el_ms"), "ttft_mean_s"),
    (("request_rate",), "request_rate"),
])
def test_missing_fields_are_named(tmp_path, capsys, drop, needle):
    d = _doc(detailed=False)
    for k in drop:
        d.pop(k)
    p = tmp_path / "m.json"
    p.write_text(json.dumps(d))
    _one_line_error(capsys, ["calibrate", str(p), "--model", "llama-2-7b", "--gpu", "H100",
                             "--out", str(tmp_path / "p.nc")], needle)


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    p = _write(tmp_path, "r.json", num_prompts=20)
    base = ["calibrate", str(p), "--gpu", "H100", "--out", str(tmp_path / "p.nc")]
    _one_line_error(capsys, base + ["--model", "no-such-model"], "unknown model")
    _one_line_error(capsys, base + ["--model", "llama-2-7b", "--tp", "3"], "--tp 3")
    _one_line_error(capsys, base + ["--model", "llama-2-7b", "--kv-blocks", "0"], "--kv-blocks")
    _one_line_error(capsys, ["calibrate", str(p), "--model", "llama-2-7b", "--gpu", "H100",
                             "--out", str(p)], str(p))
    _one_line_error(capsys, ["calibrate", str(tmp_path / "nope.json"), "--model", "llama-2-7b",
                             "--gpu", "H100", "--out", str(tmp_path / "p.nc")], "RESULT")
    # a recorded TP that is not --tp
    d = _doc()
    d["tensor_parallel_size"] = 2
    p.write_text(json.dumps(d))
    _one_line_error(capsys, base + ["--model", "llama-2-7b"], "tp=2")
    # a recorded model that is not --model
    _one_line_error(capsys, base + ["--model", "llama-2-70b", "--tp", "2"], "--model llama-2-70b")


def test_tracev2_and_detailed_vllm_give_recorded_stages():
    data = Path(__file__).parent / "data"
    for f, n in (("blis_observe.yaml", 19), ("vllm_bench_small.json", 11)):
        tabs, _ = read_client_results(data / f)
        (st,) = client_stages(tabs, *CFG, 5000, path=data / f)
        assert st.arrival_s is not None and len(st.arrival_s) == n
        assert list(st.arrival_s) == sorted(st.arrival_s) and st.arrival_s[0] >= 0.0
        assert st.observed["ttft_mean_us"] > 0 and st.observed["e2e_mean_us"] > 0


def test_real_inference_perf_run_matches_the_study_stages(real_dir):
    """An inference-perf folder gives the same stages as the lead's study builder (rate, count,
    prompt shape from profile.yaml, output-length pdf, KV blocks, measured means)."""
    from bayes_latency.study.blis.spec import find_runs
    from bayes_latency.study.client.runs import client_stages as study_stages

    runs = find_runs(real_dir, "llama-2-7b-tp1-codegen")
    tabs, _ = read_client_results(runs[0].path)
    mine = client_stages(tabs, "llama-2-7b", "H100", 1, default_kv_blocks(*CFG),
                         path=runs[0].path)
    ref = study_stages(runs[:1])
    assert len(mine) == len(ref) >= 1
    for a, b in zip(mine, ref, strict=True):
        assert (a.rate, a.count, a.prompt_len, a.kv_blocks) == (b.rate, b.count, b.prompt_len,
                                                                b.kv_blocks)
        assert (a.num_groups, a.users_per_group, a.system_prompt_len) == (
            b.num_groups, b.users_per_group, b.system_prompt_len)
        assert a.output_pdf == b.output_pdf
        assert all(math.isclose(a.observed[k], b.observed[k]) for k in b.observed)


def test_calibrate_stops_when_every_request_row_is_dropped(tmp_path, capsys):
    doc = _doc()
    doc["ttfts"] = [-1] * len(doc["ttfts"])
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    _one_line_error(capsys, ["calibrate", str(p), "--model", "llama-2-7b", "--gpu", "H100",
                             "--out", str(tmp_path / "p.nc")],
                    f"{p}: all 50 per-request record(s) were dropped (malformed:ttfts=50)")
    assert not (tmp_path / "p.nc").exists()


def test_calibrate_stops_when_a_needed_mean_is_missing(tmp_path, capsys):
    doc = _doc()
    for k in [k for k in doc if k.endswith("_e2el_ms")] + ["ttfts", "latencies", "itls",
                                                           "input_lens", "output_lens",
                                                           "start_times", "errors"]:
        doc.pop(k, None)
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    _one_line_error(capsys, ["calibrate", str(p), "--model", "llama-2-7b", "--gpu", "H100",
                             "--out", str(tmp_path / "p.nc")], "no mean E2E of successful")
    assert not (tmp_path / "p.nc").exists()
