"""Export coefficients of any configuration: a JSON document, BLIS YAML / flags, posterior draws.

The input is the coefficient Dataset of one configuration, as returned by
``LatencyModel.coefficients(model, gpu, tp)``: ``beta (sample, term)`` and
``alpha (sample, alpha_term)``.

- :func:`summarize_coefficients`: per coefficient mean, median, 5% / 95% quantiles, HDI, unit.
- :func:`export_document`: the JSON document (schema :data:`SCHEMA_VERSION`): named terms with units
  and statistics, the configuration, provenance, predicted iteration times of reference batches with
  90% bands, optional draws.
- :func:`blis_block`, :func:`blis_flags`, :func:`blis_draws`: BLIS's ``trained_physics_coefficients``
  (``alpha_coeffs`` = the 3 alpha terms, ``beta_coeffs`` = 10 values in
  :data:`~bayes_latency.physics.basis.BLIS_BETA_ORDER`), the equivalent command-line flags, and N
  posterior draws in the same form for ensemble simulation. Terms without a BLIS slot
  (``moe_dispatch``) or not exportable (``cpu_offload``, ``kv_pressure``) are left out with a note.

Every exported value must be finite and >= 0, otherwise :class:`~bayes_latency.errors.BayesLatencyError`
names the coefficient. The ``bayes-latency export`` subcommand is
:func:`bayes_latency.cli.export.export_command`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.checks.datatree import is_approximate
from bayes_latency.checks.diagnostics_report import jsonable
from bayes_latency.errors import BayesLatencyError
from bayes_latency.export.origin import config_notes, run_notes
from bayes_latency.model.posterior.predict import coefficient_arrays, predict_reference

SCHEMA_VERSION = 1
"""Version of the JSON export document."""

STATS = ("mean", "median")
"""Point statistics :func:`blis_block` can export."""


# --------------------------------------------------------------------------------------------
# coefficients


def coefficient_info(name: str) -> dict[str, Any]:
    """Unit, kind, BLIS slot, exportability and description of a beta or alpha term."""
    from bayes_latency.physics.basis import ALPHA_TERM_INFO, get_term

    if name in ALPHA_TERM_INFO:
        a = ALPHA_TERM_INFO[name]
        return {"kind": "alpha", "unit": a.unit, "blis_slot": None, "exportable": True,
                "doc": a.doc}
    t = get_term(name)
    return {"kind": "beta", "unit": t.unit, "blis_slot": t.blis_index,
            "exportable": bool(t.exportable), "doc": t.doc}


def summarize_coefficients(coefs: xr.Dataset, hdi_prob: float = 0.9) -> pd.DataFrame:
    """Posterior statistics of every coefficient of one configuration.

    Parameters
    ----------
    coefs
        ``beta (sample, term)`` and ``alpha (sample, alpha_term)``.
    hdi_prob
        Probability of the highest-density interval.

    Returns
    -------
    DataFrame
        Index ``coefficient`` (terms then alpha terms); columns ``kind, unit, mean, median, sd,
        q05, q95, hdi_low, hdi_high, blis_slot, exportable``.

    Raises
    ------
    BayesLatencyError
        When a draw is not finite or negative (names the coefficient).
    """
    import arviz_stats as azs

    beta, alpha = coefficient_arrays(coefs)
    rows = []
    for da, dim in ((beta, "term"), (alpha, "alpha_term")):
        hdi = azs.hdi(da, prob=hdi_prob, dim=["sample"]).transpose(dim, "ci_bound")
        q = da.quantile([0.05, 0.5, 0.95], dim="sample").transpose(dim, "quantile").values
        for j, name in enumerate(str(v) for v in da[dim].values):
            info = coefficient_info(name)
            vals = da.values[:, j]
            rows.append({
                "coefficient": name, "kind": info["kind"], "unit": info["unit"],
                "mean": float(vals.mean()), "median": float(q[j, 1]), "sd": float(vals.std()),
                "q05": float(q[j, 0]), "q95": float(q[j, 2]),
                "hdi_low": float(hdi.values[j, 0]), "hdi_high": float(hdi.values[j, 1]),
                "blis_slot": info["blis_slot"], "exportable": info["exportable"],
            })
    return pd.DataFrame(rows).set_index("coefficient")


# --------------------------------------------------------------------------------------------
# BLIS


def _fold_features(terms: list[str], config: Mapping[str, Any] | None) -> dict[str, float]:
    """Per-step feature of each foldable extra term in ``terms`` for ``config`` (see ``Term.fold``)."""
    from bayes_latency.physics import ServingConfig, basis_matrix, load_architecture, load_gpu
    from bayes_latency.physics.basis import get_term

    foldable = [t for t in terms if get_term(t).fold is not None]
    if not foldable:
        return {}
    if config is None or "model" not in config or "gpu" not in config:
        raise BayesLatencyError(
            f"term(s) {foldable} fold into BLIS's per-step coefficient by their per-step feature, "
            "which needs the configuration (model, gpu, tp)")
    arch = load_architecture(str(config["model"]))
    serving = ServingConfig.from_dict(dict(config), arch=arch)
    one_decode = {"num_prefill_reqs": 0.0, "prefill_tokens": 0.0, "prefill_attn_pairs": 0.0,
                  "prefill_kv_tokens": 0.0, "num_decode_reqs": 1.0, "decode_tokens": 1.0,
                  "decode_ctx_tokens": 1.0}
    x = basis_matrix(one_decode, arch, load_gpu(str(config["gpu"])), serving, foldable)[0]
    return {t: float(v) for t, v in zip(foldable, x, strict=True)}


def blis_refusal(terms: Sequence[str]) -> str | None:
    """Why coefficients of ``terms`` cannot be a BLIS vector (terms without a BLIS slot that
    cannot be folded into one), or None when they can."""
    from bayes_latency.physics.basis import get_term

    refused = [str(t) for t in terms
               if get_term(str(t)).blis_index is None and get_term(str(t)).fold is None]
    if not refused:
        return None
    return (f"term(s) {refused} have no BLIS slot and cannot be folded into one (their features "
            "vary from step to step): BLIS would not simulate their cost. Give the workload to "
            "simulate (export --workload RESULT) to project the compute knees onto BLIS's "
            "basis there, refit without them (bayes-latency fit --terms ...), or export "
            "--format json")


def _blis_vectors(beta: xr.DataArray, alpha: xr.DataArray,
                  config: Mapping[str, Any] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(sample, 3)`` alpha and ``(sample, 11)`` beta in BLIS slot order, and the notes.

    Rules (BLIS's ``StepTime`` reads ``beta_coeffs`` positionally, ``sim/latency/
    trained_physics_model.go``): every default term fills its slot (``Term.blis_index``); a slot
    whose term is not in the posterior (fitted with ``--terms``) is exported as 0, with a note;
    an extra term whose feature is a per-configuration constant (``Term.fold == "per_step"``)
    adds ``beta·x`` to the per-step slot, with a note; any other extra term is refused
    (:class:`BayesLatencyError`), because BLIS would silently not simulate its cost.
    """
    from bayes_latency.physics.basis import ALPHA_TERMS, BLIS_BETA_ORDER, get_term

    notes = []
    terms = [str(t) for t in beta["term"].values]
    if why := blis_refusal(terms):
        raise BayesLatencyError(why)
    b = np.zeros((beta.sizes["sample"], len(BLIS_BETA_ORDER)))
    for slot, name in enumerate(BLIS_BETA_ORDER):
        if name in terms:
            b[:, slot] = beta.values[:, terms.index(name)]
        else:
            notes.append(f"term {name!r} (BLIS beta slot {slot}) is not in the posterior: "
                         "exported as 0")
    step_slot = BLIS_BETA_ORDER.index("per_step")
    for name, x in _fold_features(terms, config).items():
        b[:, step_slot] += beta.values[:, terms.index(name)] * x
        notes.append(f"term {name!r} (no BLIS slot) folded into per_step (slot {step_slot}): "
                     f"coefficient x {x:g} {get_term(name).feature_unit} per step "
                     f"(exact for every non-empty step)")
    aterms = [str(t) for t in alpha["alpha_term"].values]
    a = np.zeros((alpha.sizes["sample"], len(ALPHA_TERMS)))
    for slot, name in enumerate(ALPHA_TERMS):
        if name not in aterms:
            raise BayesLatencyError(f"alpha term {name!r} is missing from the coefficients")
        a[:, slot] = alpha.values[:, aterms.index(name)]
    return a, b, notes


def _block(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    return {"trained_physics_coefficients": {"alpha_coeffs": [float(v) for v in a],
                                             "beta_coeffs": [float(v) for v in b]}}


def blis_notes(coefs: xr.Dataset, config: Mapping[str, Any] | None = None) -> list[str]:
    """Notes on terms folded into, left out of, or missing from the BLIS export of ``coefs``."""
    return _blis_vectors(*coefficient_arrays(coefs), config)[2]


def export_notes(coefs: xr.Dataset, config: Mapping[str, Any] | None = None,
                 origin_notes: Sequence[str] | None = None) -> list[str]:
    """The notes of an export: where the coefficients come from (``origin_notes``, by default
    :func:`config_notes`: is the configuration unseen, and where each level's effect came from),
    then :func:`blis_notes` (terms folded or left out)."""
    origin = config_notes(coefs) if origin_notes is None else list(origin_notes)
    why = blis_refusal([str(t) for t in coefs["term"].values])
    blis = blis_notes(coefs, config) if why is None else [f"no BLIS vector: {why}"]
    return origin + run_notes(coefs) + blis


def blis_block(coefs: xr.Dataset, stat: str = "mean",
               config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """BLIS ``trained_physics_coefficients`` of one configuration.

    Parameters
    ----------
    coefs
        ``beta (sample, term)`` and ``alpha (sample, alpha_term)``.
    stat
        ``"mean"`` or ``"median"`` of the draws.
    config
        The configuration (``model``, ``gpu``, ``tp``); needed only to fold extra terms.

    Returns
    -------
    dict
        ``{"trained_physics_coefficients": {"alpha_coeffs": [3 floats], "beta_coeffs": [11 floats
        in BLIS_BETA_ORDER]}}``: alpha = (ARRIVED -> QUEUED delay µs, fixed completion overhead
        µs, µs added to every inter-token interval), beta in BLIS's slot order. See
        :func:`blis_notes` for terms folded or left out.

    Raises
    ------
    BayesLatencyError
        Unknown ``stat``, a term BLIS cannot represent, or a non-finite / negative coefficient.
    """
    if stat not in STATS:
        raise BayesLatencyError(f"unknown statistic {stat!r}; use one of {STATS}")
    a, b, _ = _blis_vectors(*coefficient_arrays(coefs), config)
    reduce = np.mean if stat == "mean" else np.median
    return _block(reduce(a, axis=0), reduce(b, axis=0))


def _fmt(v: float) -> str:
    return f"{v:.10g}"


def blis_flags(coefs: xr.Dataset | Mapping[str, Any], stat: str = "mean") -> str:
    """BLIS command-line flags ``--alpha-coeffs a,b,c --beta-coeffs b0,...,b10``.

    Parameters
    ----------
    coefs
        Coefficients (as for :func:`blis_block`) or a block returned by it.
    stat
        Statistic when ``coefs`` is a Dataset.
    """
    block = blis_block(coefs, stat) if isinstance(coefs, xr.Dataset) else coefs
    tp = block["trained_physics_coefficients"]
    return (f"--alpha-coeffs {','.join(_fmt(v) for v in tp['alpha_coeffs'])} "
            f"--beta-coeffs {','.join(_fmt(v) for v in tp['beta_coeffs'])}")


def _pick_draws(n_total: int, n_draws: int, seed: int) -> np.ndarray:
    if n_draws <= 0:
        raise BayesLatencyError(f"number of draws must be positive, got {n_draws}")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_total, size=n_draws, replace=n_draws > n_total))


def blis_draws(coefs: xr.Dataset, n_draws: int, seed: int = 0,
               config: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``n_draws`` posterior draws, each a BLIS block (for ensemble simulation).

    Draws are taken without replacement (with replacement only when more are asked for than
    exist), in sample order, with a seeded generator.
    """
    a, b, _ = _blis_vectors(*coefficient_arrays(coefs), config)
    idx = _pick_draws(a.shape[0], n_draws, seed)
    return [_block(a[i], b[i]) for i in idx]


# --------------------------------------------------------------------------------------------
# the JSON document


def export_document(coefs: xr.Dataset, config: Mapping[str, Any], provenance: Mapping[str, Any],
                    reference_batches: pd.DataFrame | Mapping | None = None, *,
                    n_draws: int = 0, hdi_prob: float = 0.9, seed: int = 0,
                    step_noise: Mapping[str, Any] | None = None,
                    origin_notes: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON export document of one configuration.

    Parameters
    ----------
    coefs
        ``beta (sample, term)``, ``alpha (sample, alpha_term)``.
    config
        Configuration: ``model``, ``gpu``, ``tp`` and optional serving knobs (the full serving
        config is recorded when the model and GPU are known to the physics layer).
    provenance
        Posterior file sha256, package version, priors hash, model version, method, approximate
        flag ... (see :func:`provenance`), stored as given.
    reference_batches
        See :func:`predict_reference` (None = the default set).
    n_draws
        Also include this many posterior draws (0 = none).
    hdi_prob
        HDI probability of the statistics.
    seed
        Seed of the draw selection.
    step_noise
        Noise class -> :class:`~bayes_latency.model.definition.likelihood.NoiseParams` of the
        configuration's steps (:func:`step_noise_of`); None leaves ``step_noise`` out.
    origin_notes
        Where the coefficients come from (None: :func:`config_notes`; a zero-shot export
        gives :func:`population_notes`); :func:`blis_notes` follow.

    Returns
    -------
    dict
        JSON-serialisable: ``schema_version, configuration, provenance, hdi_prob, terms (list of
        {name, kind, unit, blis_slot, exportable, doc, mean, median, sd, q05, q95, hdi_low,
        hdi_high}), blis {trained_physics_coefficients, flags}, reference_predictions, notes``,
        ``step_noise`` (:func:`step_noise_block`) when given and ``draws`` (``{terms,
        alpha_terms, beta: [[...]], alpha: [[...]]}``) when asked.

    Raises
    ------
    BayesLatencyError
        Non-finite or negative coefficient; ConfigError for an unknown model / GPU.
    """
    beta, alpha = coefficient_arrays(coefs)
    summary = summarize_coefficients(coefs, hdi_prob)
    notes = export_notes(coefs, config, origin_notes)
    terms = []
    for name, row in summary.iterrows():
        info = coefficient_info(str(name))
        terms.append({"name": str(name), "kind": row["kind"], "unit": row["unit"],
                      "blis_slot": info["blis_slot"], "exportable": info["exportable"],
                      "doc": info["doc"],
                      **{k: float(row[k]) for k in ("mean", "median", "sd", "q05", "q95",
                                                     "hdi_low", "hdi_high")}})
    configuration = dict(config)
    reference = []
    if "model" in config and "gpu" in config:
        from bayes_latency.physics import ServingConfig, load_architecture

        arch = load_architecture(str(config["model"]))
        configuration["architecture"] = arch.name
        configuration["serving"] = ServingConfig.from_dict(dict(config), arch=arch).to_dict()
        ref = predict_reference(coefs, config, reference_batches)
        for name, row in ref.iterrows():
            batch = {c: float(row[c]) for c in ref.columns
                     if c not in ("mean_us", "median_us", "q05_us", "q95_us")}
            reference.append({"name": str(name), "batch": batch,
                              **{k: float(row[k]) for k in ("mean_us", "median_us", "q05_us",
                                                             "q95_us")}})
    else:
        notes.append("configuration has no model/gpu: reference predictions left out")
    why = blis_refusal([str(t) for t in beta["term"].values])
    block = blis_block(coefs, "mean", config) if why is None else None
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "configuration": jsonable(configuration),
        "provenance": jsonable(dict(provenance)),
        "hdi_prob": hdi_prob,
        "n_posterior_draws": int(beta.sizes["sample"]),
        "terms": terms,
        "blis": None if block is None else {**block, "stat": "mean", "flags": blis_flags(block)},
        "reference_predictions": reference,
        "notes": notes,
    }
    if step_noise is not None:
        doc["step_noise"] = step_noise_block(step_noise)
    if n_draws:
        idx = _pick_draws(beta.sizes["sample"], n_draws, seed)
        doc["draws"] = {
            "terms": [str(t) for t in beta["term"].values],
            "alpha_terms": [str(t) for t in alpha["alpha_term"].values],
            "beta": beta.values[idx].tolist(),
            "alpha": alpha.values[idx].tolist(),
        }
    return doc


# --------------------------------------------------------------------------------------------
# provenance and the CLI


#: Noise classes of one engine step whose scale the JSON export carries (``step_noise``).
STEP_NOISE_CLASSES = ("iteration", "iteration_prefill")
#: How a simulator draws a step time from the exported ``step_noise`` (see
#: :mod:`bayes_latency.model.definition.likelihood`).
STEP_NOISE_FORMULA = ("log(step_us) = log(predicted_us) + s * t_nu, s = sigma * (load / "
                      "load_ref)^gamma, the factor (load / load_ref)^gamma clipped to "
                      "[1/4, 4]; load: requests in the step (load 'batch', 'batch-growth'), "
                      "us of roofline KV-cache reads of the step (load 'kv'), 1 (load 'none'); "
                      "'iteration_prefill': steps with a prefill chunk")


def step_noise_of(model: Any, coefs: xr.Dataset) -> dict[str, Any]:
    """The step noise classes' parameters (:data:`STEP_NOISE_CLASSES`) of the configuration of
    ``coefs`` (its ``config_id`` attribute; the fleet median for an unseen one) in ``model``."""
    cid = str(coefs.attrs.get("config_id", ""))
    return {k: model.noise(cid, k) for k in STEP_NOISE_CLASSES}


def step_noise_block(noise: Mapping[str, Any]) -> dict[str, Any]:
    """The scatter of one step's time around its prediction, per noise class, for a simulator
    that draws step times (the fit's Student-t on the log scale, its scale growing with the
    step's load; :data:`STEP_NOISE_FORMULA`).

    Parameters
    ----------
    noise
        Noise class -> :class:`~bayes_latency.model.definition.likelihood.NoiseParams` of the configuration.

    Returns
    -------
    dict
        ``{"formula": ..., "classes": {class: {sigma, nu, load, gamma, load_ref}}}``;
        ``load_ref`` in the load's units (requests per step, or µs of KV reads per step).
    """
    return {"formula": STEP_NOISE_FORMULA,
            "classes": {str(k): {"sigma": float(p.sigma), "nu": float(p.nu), "load": str(p.load),
                                 "gamma": float(p.gamma),
                                 "load_ref": float(np.exp(p.load_ref))}
                        for k, p in noise.items()}}


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def provenance(result_attrs: Mapping[str, Any], posterior_path: str | Path | None = None
               ) -> dict[str, Any]:
    """Provenance record of an export.

    Parameters
    ----------
    result_attrs
        ``model.result.attrs`` (``bayes_latency_version, model_version, priors_hash, data_hash,
        method, sampler, approximate``).
    posterior_path
        The posterior file (its sha256 is recorded).
    """
    from bayes_latency import __version__

    out: dict[str, Any] = {
        "package_version": __version__,
        "fit_package_version": result_attrs.get("bayes_latency_version"),
        "model_version": result_attrs.get("model_version"),
        "priors_hash": result_attrs.get("priors_hash"),
        "data_hash": result_attrs.get("data_hash"),
        "method": result_attrs.get("method"),
        "sampler": result_attrs.get("sampler"),
        "approximate": is_approximate(result_attrs),
    }
    if posterior_path is not None:
        out["posterior_file"] = Path(posterior_path).name
        out["posterior_sha256"] = file_sha256(posterior_path)
    return jsonable(out)


def blis_hardware(config: Mapping[str, Any]) -> dict[str, Any]:
    """How to tell BLIS about the GPU: ``--hardware NAME`` and, for a GPU BLIS's own
    ``hardware_config.json`` lacks, the entry to add to it (the exported coefficients multiply
    features computed from exactly these numbers)."""
    from bayes_latency.physics import load_gpu

    hw = load_gpu(str(config["gpu"])).blis
    out: dict[str, Any] = {"name": hw.name, "in_blis_hardware_config": hw.in_blis}
    if not hw.in_blis:
        out["hardware_config_entry"] = {hw.name: hw.to_hardware_config()}
    return out


def blis_yaml(coefs: xr.Dataset, config: Mapping[str, Any], prov: Mapping[str, Any],
              n_draws: int = 0, seed: int = 0, stat: str = "mean",
              extra_notes: Sequence[str] = (), origin_notes: Sequence[str] | None = None,
              source: str = "posterior") -> str:
    """BLIS YAML text: the block, its flags (as a comment and as ``blis_flags``), configuration,
    provenance, notes (:func:`export_notes` with ``origin_notes``, then ``extra_notes``) and,
    when ``n_draws``, a ``draws`` list of blocks. ``source`` names the draws in the header
    (``posterior``, or ``population`` for a zero-shot export)."""
    import yaml

    block = blis_block(coefs, stat, config)
    flags = blis_flags(block)
    doc: dict[str, Any] = {**block, "blis_flags": flags, "stat": stat,
                           "configuration": jsonable(dict(config)),
                           "blis_hardware": blis_hardware(config),
                           "provenance": jsonable(dict(prov)),
                           "notes": export_notes(coefs, config, origin_notes)
                           + list(extra_notes)}
    if n_draws:
        doc["draws"] = blis_draws(coefs, n_draws, seed, config)
    header = (f"# bayes-latency export for model={config.get('model')} gpu={config.get('gpu')} "
              f"tp={config.get('tp')} ({stat} of the {source} draws)\n# {flags}\n")
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)


def _check_finite(doc: Any, where: str = "") -> None:
    """Refuse an export document holding a non-finite number (NaN or inf) anywhere."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            _check_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(doc, (list, tuple)):
        for i, v in enumerate(doc):
            _check_finite(v, f"{where}[{i}]")
    elif isinstance(doc, float) and not np.isfinite(doc):
        raise BayesLatencyError(f"the export would hold a non-finite number at {where} "
                                f"({doc}): the posterior, or the model's config.json or GPU "
                                f"datasheet given, is unusable for this configuration")
