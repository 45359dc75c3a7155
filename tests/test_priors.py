"""Prior files: the default loads, lookups merge overrides, invalid files name file/term/field."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from bayes_latency.errors import PriorError
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.priors import DEFAULT_PRIORS_PATH, REQUIRED_NOISE_KINDS, load_priors


def _default_raw() -> dict[str, Any]:
    return yaml.safe_load(DEFAULT_PRIORS_PATH.read_text())


def _write(tmp_path: Path, raw: dict[str, Any], name: str = "p.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    return f


def test_default_loads() -> None:
    p = load_priors()
    assert p.path == str(DEFAULT_PRIORS_PATH) and p.schema_version == 1
    for t in (*DEFAULT_TERMS, *ALPHA_TERMS):
        e = p.term(t)
        assert e["dist"] == "lognormal" and e["median"] > 0 and 0.5 <= e["sigma"] <= 1.2
        assert e["rationale"]
    assert abs(p.prior_median("prefill_compute") - 0.4) < 1e-12
    assert p.prior_median("decode_compute") == 5.0
    assert 500 <= p.prior_median("per_step") <= 3000
    assert 1000 <= p.prior_median("alpha_arrival") <= 20000
    for eff, s in (("model", 0.25), ("gpu", 0.3), ("tp", 0.3)):
        assert p.hierarchy_scale(eff) == {"dist": "halfnormal", "sigma": s}
    assert p.hierarchy_without("tp") == ("weight_loading", "alpha_arrival", "alpha_post_decode",
                                         "alpha_per_token")
    assert p.hierarchy_without("model") == ()
    assert p.ard == {"dist": "logistic_gate", "loc": -1.5, "scale": 1.0, "sharpness": 4.0}
    for k in REQUIRED_NOISE_KINDS:
        n = p.noise_prior(k)
        assert n["sigma"]["dist"] == "halfnormal" and n["nu"] == {"dist": "gamma", "alpha": 2.0, "beta": 0.1}
    assert len(p.hash) == 64


def test_gpu_overrides_and_log_space() -> None:
    p = load_priors()
    base = p.term("prefill_compute")
    a100 = p.term("prefill_compute", gpu="A100")          # alias -> A100-80GB
    assert a100["median"] > base["median"] and a100["sigma"] == base["sigma"]
    assert p.term("prefill_compute", gpu=load_gpu("a100-80gb")) == a100
    assert p.term("prefill_compute", gpu="H100") == base
    assert p.term("per_step", gpu="A100") == p.term("per_step")
    mu, sd = p.log_mean_sd("prefill_compute", "A100")
    assert mu == pytest.approx(math.log(a100["median"])) and sd == a100["sigma"]
    assert p.prior_median("prefill_compute", "unknown-gpu") == base["median"]
    with pytest.raises(PriorError, match="no prior"):
        p.term("not_a_term")


def test_hash_is_content_based(tmp_path: Path) -> None:
    raw = _default_raw()
    h0 = load_priors().hash
    assert load_priors(_write(tmp_path, raw, "copy.yaml")).hash == h0     # path does not matter
    raw["terms"]["per_step"]["median"] = 1200      # int vs float: same content
    assert load_priors(_write(tmp_path, raw, "int.yaml")).hash == h0
    raw["terms"]["per_step"]["median"] = 1300.0
    assert load_priors(_write(tmp_path, raw, "changed.yaml")).hash != h0
    assert load_priors(copy.deepcopy(_default_raw())).hash == h0


def test_custom_term_set(tmp_path: Path) -> None:
    raw = _default_raw()
    keep = ("prefill_compute", "per_step")
    raw["terms"] = {k: v for k, v in raw["terms"].items() if k in keep or k in ALPHA_TERMS}
    raw["gpu_overrides"] = {"A100-80GB": {"prefill_compute": {"median": 2.5}}}
    f = _write(tmp_path, raw)
    with pytest.raises(PriorError, match="prefill_kv"):
        load_priors(f)
    p = load_priors(f, terms=keep)
    assert p.term_names == [*keep, *ALPHA_TERMS]


def _mutate(raw: dict[str, Any], case: str) -> dict[str, Any]:
    t = raw["terms"]
    if case == "unknown_dist":
        t["decode_kv"]["dist"] = "weibull"
    elif case == "missing_term":
        del t["decode_kv"]
    elif case == "negative_sigma":
        t["decode_kv"]["sigma"] = -0.5
    elif case == "zero_median":
        t["decode_kv"]["median"] = 0
    elif case == "missing_param":
        del t["decode_kv"]["sigma"]
    elif case == "unknown_key":
        t["decode_kv"]["mediam"] = 1.0
    elif case == "non_numeric":
        t["decode_kv"]["median"] = "big"
    elif case == "not_lognormal":
        t["decode_kv"] = {"dist": "normal", "mu": 0.0, "sigma": 1.0}
    elif case == "unknown_term":
        t["decode_kvv"] = dict(t["decode_kv"])
    return raw


@pytest.mark.parametrize("case,field", [
    ("unknown_dist", "dist"), ("missing_term", "terms"), ("negative_sigma", "sigma"),
    ("zero_median", "median"), ("missing_param", "sigma"), ("unknown_key", "mediam"),
    ("non_numeric", "median"), ("not_lognormal", "dist"), ("unknown_term", "terms"),
])
def test_term_errors_name_file_term_field(tmp_path: Path, case: str, field: str) -> None:
    f = _write(tmp_path, _mutate(_default_raw(), case))
    with pytest.raises(PriorError) as ei:
        load_priors(f)
    msg = str(ei.value)
    term = "decode_kvv" if case == "unknown_term" else "decode_kv"
    assert str(f) in msg and f"term '{term}'" in msg and f"field '{field}'" in msg, msg


@pytest.mark.parametrize("mutation,where,field", [
    (lambda r: r.update(schema_version=2), "top level", "schema_version"),
    (lambda r: r.pop("schema_version"), "top level", "schema_version"),
    (lambda r: r.update(extra_section={}), "top level", "extra_section"),
    (lambda r: r["hierarchy"].pop("tp"), "hierarchy 'tp'", "hierarchy"),
    (lambda r: r["hierarchy"]["gpu"].update(sigma=0), "hierarchy 'gpu'", "sigma"),
    (lambda r: r["hierarchy"]["gpu"].update(dist="normal"), "hierarchy 'gpu'", "dist"),
    (lambda r: r["hierarchy"]["gpu"].update(spread=-1), "hierarchy 'gpu'", "spread"),
    (lambda r: r["hierarchy"]["tp"].update(without="weight_loading"), "hierarchy 'tp'", "without"),
    (lambda r: r["hierarchy"]["tp"].update(without=["weight_loadin"]), "hierarchy 'tp'", "without"),
    (lambda r: r["hierarchy"]["config"].update(without=["per_step"]), "hierarchy 'config'",
     "without"),
    (lambda r: r.update(ard={"dist": "beta", "alpha": 1.0}), "ard", "beta"),
    (lambda r: r["noise"].pop("step_window"), "noise 'step_window'", "noise"),
    (lambda r: r["noise"]["iteration"].pop("nu"), "noise 'iteration'", "nu"),
    (lambda r: r["noise"]["iteration"]["nu"].update(alpha=-2), "noise 'iteration' 'nu'", "alpha"),
    (lambda r: r["noise"]["iteration"]["sigma"].update(dist="cauchy"), "noise 'iteration' 'sigma'", "dist"),
    (lambda r: r["gpu_overrides"]["A100-80GB"]["prefill_compute"].update(sigma=-1),
     "gpu_overrides 'A100-80GB' term 'prefill_compute'", "sigma"),
    (lambda r: r["gpu_overrides"]["A100-80GB"]["prefill_compute"].update(medain=3),
     "gpu_overrides 'A100-80GB' term 'prefill_compute'", "medain"),
    (lambda r: r["gpu_overrides"]["A100-80GB"].update(nope={"median": 2}),
     "gpu_overrides 'A100-80GB' term 'nope'", "nope"),
])
def test_section_errors(tmp_path: Path, mutation: Any, where: str, field: str) -> None:
    raw = _default_raw()
    mutation(raw)
    f = _write(tmp_path, raw)
    with pytest.raises(PriorError) as ei:
        load_priors(f)
    msg = str(ei.value)
    assert str(f) in msg and where in msg and f"field '{field}'" in msg, msg


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(PriorError, match="not found"):
        load_priors(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("terms: [unclosed\n")
    with pytest.raises(PriorError, match="bad.yaml"):
        load_priors(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(PriorError, match="list.yaml"):
        load_priors(lst)
