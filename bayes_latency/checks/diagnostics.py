"""Convergence and fit diagnostics of a posterior, with stated quality gates.

:func:`diagnose` reads a fitted :class:`xarray.DataTree` (the ``result`` of
:class:`~bayes_latency.model.estimator.LatencyModel`) and checks:

- rank-normalised split R-hat, bulk and tail ESS of every posterior variable (worst value per
  variable, and per (config, term) cell for ``beta`` and ``alpha``);
- sampler statistics: divergences, E-BFMI per chain, share of transitions that saturated the
  maximum tree depth (nutpie and PyMC names are both understood);
- PSIS-LOO with Pareto-k when a ``log_likelihood`` group exists (a warning gate only);
- prior sensitivity (power-scaling, :func:`arviz_stats.psense_summary`) when the result has
  ``log_prior`` and ``log_likelihood`` groups: which coefficients the priors dominate and which
  the data do (:func:`prior_sensitivity`, informative, never a gate), reported next to the
  identifiability analysis of the fit.

Each gate has a threshold in :class:`Thresholds`. A posterior made by an approximate method
(``result.attrs["approximate"] == "true"``, e.g. Laplace) has no Markov chains: its R-hat and ESS
gates are reported as ``n/a (approximate)`` and the report says so at the top.

The report types are in :mod:`bayes_latency.checks.diagnostics_report`, the prior sensitivity in
:mod:`bayes_latency.checks.sensitivity`, the DataTree helpers in :mod:`bayes_latency.checks.datatree`
(their public names are re-exported here), and the ``bayes-latency check`` subcommand
(:func:`~bayes_latency.cli.check.check_command`) in :mod:`bayes_latency.cli.check`.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.checks.datatree import (  # noqa: F401 - public names re-exported
    CELL_VARIABLES,
    SAMPLE_DIMS,
    _group,
    _label,
    _numeric_posterior,
    is_approximate,
    log_likelihood_tree,
)
from bayes_latency.checks.diagnostics_report import (  # noqa: F401 - public names re-exported
    DiagnosticsReport,
    Gate,
    Thresholds,
    _fmt,
    _markdown_table,
    jsonable,
)
from bayes_latency.checks.sensitivity import (  # noqa: F401 - public names re-exported
    COEFFICIENT_PRIORS,
    SENSITIVITY_THRESHOLD,
    prior_sensitivity,
)

_TREE_FLAGS = ("reached_max_treedepth", "maxdepth_reached")
_TREE_DEPTH = ("tree_depth", "depth")
_MAX_DEPTH_ATTRS = ("max_treedepth", "maxdepth", "max_tree_depth")

# --------------------------------------------------------------------------------------------
# the pieces of diagnose


def _convergence(post: xr.Dataset) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-variable and per-cell R-hat / ESS tables."""
    import arviz_stats as azs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rhat = azs.rhat(post, sample_dims=list(SAMPLE_DIMS))
        ess_bulk = azs.ess(post, sample_dims=list(SAMPLE_DIMS), method="bulk")
        ess_tail = azs.ess(post, sample_dims=list(SAMPLE_DIMS), method="tail")
    rows = []
    for v in post.data_vars:
        r = np.asarray(rhat[v].values, dtype=float).ravel()
        eb = np.asarray(ess_bulk[v].values, dtype=float).ravel()
        et = np.asarray(ess_tail[v].values, dtype=float).ravel()
        finite = np.isfinite(r)
        worst = _label(rhat[v].rename(v), int(np.nanargmax(r))) if finite.any() else ""
        rows.append({
            "variable": str(v),
            "size": int(r.size),
            "rhat_max": float(np.nanmax(r)) if finite.any() else np.nan,
            "rhat_worst": worst,
            "ess_bulk_min": float(np.nanmin(eb)) if np.isfinite(eb).any() else np.nan,
            "ess_tail_min": float(np.nanmin(et)) if np.isfinite(et).any() else np.nan,
        })
    table = pd.DataFrame(rows, columns=["variable", "size", "rhat_max", "rhat_worst",
                                        "ess_bulk_min", "ess_tail_min"]).set_index("variable")
    cell_frames = []
    for v in CELL_VARIABLES:
        if v not in rhat.data_vars or rhat[v].ndim != 2:
            continue
        cell = xr.Dataset({"rhat": rhat[v], "ess_bulk": ess_bulk[v], "ess_tail": ess_tail[v]})
        df = cell.to_dataframe().reset_index()
        config_dim = "config" if "config" in rhat[v].dims else rhat[v].dims[0]
        term_dim = next(d for d in rhat[v].dims if d != config_dim)
        df = df.rename(columns={config_dim: "config", term_dim: "term"})
        df.insert(0, "variable", v)
        cell_frames.append(df[["variable", "config", "term", "rhat", "ess_bulk", "ess_tail"]])
    cells = (pd.concat(cell_frames, ignore_index=True) if cell_frames else
             pd.DataFrame(columns=["variable", "config", "term", "rhat", "ess_bulk", "ess_tail"]))
    return table, cells


def _sampler_stats(stats: xr.Dataset | None, n_chains: int, n_draws: int) -> dict[str, Any]:
    out: dict[str, Any] = {"n_chains": n_chains, "n_draws": n_draws,
                           "divergences": None, "ebfmi": None, "treedepth_share": None}
    if stats is None:
        return out
    if "diverging" in stats:
        out["divergences"] = int(np.asarray(stats["diverging"].values).astype(bool).sum())
    if "energy" in stats:
        import arviz_stats as azs

        energy = stats["energy"]
        if "chain" in energy.dims and energy.sizes.get("draw", 0) > 2:
            e = np.asarray(energy.transpose("chain", "draw").values, dtype=float)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                out["ebfmi"] = [float(x) for x in np.atleast_1d(azs.bfmi(e))]
    flag = next((f for f in _TREE_FLAGS if f in stats), None)
    if flag is not None:
        out["treedepth_share"] = float(np.asarray(stats[flag].values).astype(bool).mean())
    else:
        depth = next((d for d in _TREE_DEPTH if d in stats), None)
        max_depth = next((stats.attrs[a] for a in _MAX_DEPTH_ATTRS if a in stats.attrs), None)
        if depth is not None and max_depth is not None:
            out["treedepth_share"] = float(
                (np.asarray(stats[depth].values) >= float(max_depth)).mean())
    return out


def _loo_summary(result: xr.DataTree, th: Thresholds) -> dict[str, Any] | None:
    tree = log_likelihood_tree(result)
    if tree is None:
        return None
    import arviz_stats as azs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = azs.loo(tree, pointwise=True)
    k = np.asarray(res.pareto_k.values, dtype=float).ravel()
    n_high = int((k > th.pareto_k).sum())
    out = {
        "elpd": float(res.elpd),
        "se": float(res.se),
        "p": float(res.p),
        "n_obs": int(k.size),
        "n_samples": int(res.n_samples),
        "n_k_high": n_high,
        "share_k_high": n_high / max(k.size, 1),
        "max_k": float(np.nanmax(k)) if k.size else np.nan,
    }
    ll_attrs = result["log_likelihood"].attrs
    if str(ll_attrs.get("subsample", "false")) == "true":
        # a simple random sample of the fitted rows: scale up, with its sampling error
        n_all = int(ll_attrs.get("n_rows_fitted", k.size))
        e = np.asarray(res.elpd_i.values, dtype=float).ravel()
        n = e.size
        out["subsample"] = f"{n} of {n_all} fitted rows (simple random sample)"
        out["elpd_all_rows"] = float(n_all * e.mean())
        out["elpd_all_rows_subsample_se"] = float(
            n_all * e.std(ddof=1) / np.sqrt(n) * np.sqrt(max(1.0 - n / n_all, 0.0))) if n > 1 else np.nan
    return out


def diagnose(result: xr.DataTree, thresholds: Thresholds | None = None) -> DiagnosticsReport:
    """Diagnose a fitted posterior against the quality gates of ``thresholds``.

    Parameters
    ----------
    result
        Fitted DataTree with at least a ``posterior`` group (``chain``, ``draw`` dims); optional
        ``sample_stats`` and ``log_likelihood`` groups.
    thresholds
        Gates to apply (default :class:`Thresholds`).

    Returns
    -------
    DiagnosticsReport
        With ``passed`` False when any gate fails. R-hat and ESS gates are ``n/a (approximate)``
        for an approximate posterior; sampler gates are ``n/a`` when the statistic is missing;
        the Pareto-k gate only warns.

    Raises
    ------
    BayesLatencyError
        When ``result`` has no posterior group.
    """
    from bayes_latency.errors import BayesLatencyError

    th = thresholds or Thresholds()
    post = _group(result, "posterior")
    if post is None:
        raise BayesLatencyError("result has no posterior group: nothing to diagnose")
    post = _numeric_posterior(post)
    approximate = is_approximate(result)
    attrs = {k: result.attrs[k] for k in ("method", "sampler", "approximate", "model_version",
                                            "bayes_latency_version", "priors_hash", "data_hash")
             if k in result.attrs}
    n_chains = int(post.sizes.get("chain", 1))
    n_draws = int(post.sizes.get("draw", 0))
    failures: list[str] = []
    warns: list[str] = []
    gates: list[Gate] = []

    table, cells = _convergence(post)

    # R-hat / ESS: (gate, per-variable column, per-cell column, threshold text, is-bad test)
    if approximate:
        warns.append("approximate posterior: R-hat and ESS gates do not apply")
    for name, col, cell_col, thr, worse in (
        ("R-hat", "rhat_max", "rhat", f"<= {th.max_rhat}", lambda v: v > th.max_rhat),
        ("ESS bulk", "ess_bulk_min", "ess_bulk", f">= {th.min_ess_bulk:g}",
         lambda v: v < th.min_ess_bulk),
        ("ESS tail", "ess_tail_min", "ess_tail", f">= {th.min_ess_tail:g}",
         lambda v: v < th.min_ess_tail),
    ):
        values = table[col].dropna()
        value = (values.max() if col == "rhat_max" else values.min()) if len(values) else np.nan
        if approximate:
            gates.append(Gate(name, _fmt(value), thr, "n/a (approximate)"))
            continue
        if not np.isfinite(value):
            gates.append(Gate(name, "nan", thr, "n/a", "no finite values"))
            continue
        if not worse(value):
            gates.append(Gate(name, _fmt(value), thr, "pass"))
            continue
        detail = f"variables: {', '.join(values.index[worse(values)])}"
        bad_cells = cells[worse(cells[cell_col].astype(float))] if not cells.empty else cells
        if len(bad_cells):
            worst = bad_cells.sort_values(cell_col, ascending=(col != "rhat_max")).head(5)
            detail += (f" ({len(bad_cells)} beta/alpha cells, worst: "
                       + "; ".join(f"{r.variable}[{r.config}, {r.term}]={_fmt(getattr(r, cell_col))}"
                                   for r in worst.itertuples()) + ")")
        failures.append(f"{name} {_fmt(value)} (gate {thr}): {detail}")
        gates.append(Gate(name, _fmt(value), thr, "fail", detail))

    # sampler statistics
    sampler = _sampler_stats(_group(result, "sample_stats"), n_chains, n_draws)
    div = sampler["divergences"]
    if div is None:
        gates.append(Gate("divergences", "-", f"<= {th.max_divergences}", "n/a",
                          "no 'diverging' sampler statistic"))
    else:
        bad = div > th.max_divergences
        total = n_chains * n_draws
        gates.append(Gate("divergences", str(div), f"<= {th.max_divergences}",
                          "fail" if bad else "pass", f"of {total} transitions"))
        if bad:
            failures.append(f"{div} divergent transitions of {total} (gate <= {th.max_divergences})")
    eb = sampler["ebfmi"]
    if eb is None:
        gates.append(Gate("E-BFMI", "-", f">= {th.min_ebfmi}", "n/a", "no 'energy' statistic"))
    else:
        low = [i for i, v in enumerate(eb) if not v >= th.min_ebfmi]
        value = ", ".join(_fmt(v) for v in eb)
        gates.append(Gate("E-BFMI", value, f">= {th.min_ebfmi}", "fail" if low else "pass",
                          f"per chain; low in chains {low}" if low else "per chain"))
        if low:
            failures.append(f"E-BFMI below {th.min_ebfmi} in chains {low}: {value}")
    share = sampler["treedepth_share"]
    if share is None:
        gates.append(Gate("tree depth saturation", "-", f"<= {th.max_treedepth_share:.0%}", "n/a",
                          "no tree-depth statistic"))
    else:
        bad = share > th.max_treedepth_share
        gates.append(Gate("tree depth saturation", f"{share:.2%}",
                          f"<= {th.max_treedepth_share:.0%}", "fail" if bad else "pass"))
        if bad:
            failures.append(f"{share:.2%} of transitions hit the maximum tree depth "
                            f"(gate <= {th.max_treedepth_share:.0%})")

    # PSIS-LOO
    loo = None
    try:
        loo = _loo_summary(result, th)
    except Exception as e:  # noqa: BLE001 - LOO is informative, never fatal
        warns.append(f"PSIS-LOO could not be computed: {e}")
    if loo is None:
        gates.append(Gate("Pareto-k", "-", f"share k>{th.pareto_k} <= {th.max_pareto_k_share:.0%}",
                          "n/a", "LOO not available (no log_likelihood group)"))
    else:
        bad = loo["share_k_high"] > th.max_pareto_k_share
        gates.append(Gate("Pareto-k", f"{loo['n_k_high']} of {loo['n_obs']} "
                          f"({loo['share_k_high']:.2%})",
                          f"share k>{th.pareto_k} <= {th.max_pareto_k_share:.0%}",
                          "warn" if bad else "pass", f"elpd_loo {loo['elpd']:.1f} ± {loo['se']:.1f}"))
        if bad:
            warns.append(f"{loo['n_k_high']} of {loo['n_obs']} observations have Pareto k > "
                         f"{th.pareto_k}: PSIS-LOO is unreliable for them")

    # prior sensitivity (informative) and the identifiability analysis stored by the fit
    sensitivity = None
    try:
        sensitivity = prior_sensitivity(result)
    except Exception as e:  # noqa: BLE001 - informative, never fatal
        warns.append(f"prior sensitivity could not be computed: {type(e).__name__}: {e}")
    ident = None
    if "identifiability" in result.attrs:
        try:
            ident = json.loads(result.attrs["identifiability"])
        except (TypeError, ValueError):
            ident = None

    return DiagnosticsReport(
        passed=not failures, failures=failures, warnings=warns, gates=gates, table=table,
        cells=cells, sampler=sampler, loo=loo, approximate=approximate, attrs=attrs,
        thresholds=th, sensitivity=sensitivity, identifiability=ident,
    )


def compare_variants(results: dict[str, xr.DataTree], var_name: str | None = None) -> pd.DataFrame:
    """Compare model variants by PSIS-LOO expected log predictive density (``az.compare``).

    Parameters
    ----------
    results
        Variant name -> fitted DataTree with a ``log_likelihood`` group over the *same*
        observations (e.g. ``full``, ``no_pooling``, ``complete_pooling``, ``no_ard``).
    var_name
        Log-likelihood variable (default ``obs`` or the only one).

    Returns
    -------
    DataFrame
        ArviZ's comparison table (index = variant, best first): ``rank, elpd_diff, dse,
        p_worse, p, elpd, se, weight`` (unrounded).

    Raises
    ------
    BayesLatencyError
        When fewer than two variants are given, a variant has no log-likelihood, or the variants
        were not evaluated on the same observations.
    """
    import arviz_stats as azs

    from bayes_latency.errors import BayesLatencyError

    if len(results) < 2:
        raise BayesLatencyError("compare_variants needs at least two variants")
    trees = {}
    for name, res in results.items():
        tree = log_likelihood_tree(res, var_name)
        if tree is None:
            raise BayesLatencyError(f"variant {name!r} has no log_likelihood group: cannot compare")
        trees[name] = tree
    sizes = {n: int(np.prod([s for d, s in t["log_likelihood"].sizes.items()
                             if d not in SAMPLE_DIMS])) for n, t in trees.items()}
    if len(set(sizes.values())) > 1:
        raise BayesLatencyError(f"variants have log-likelihoods over different observations: {sizes}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = azs.compare(trees, round_to=6)
    return pd.DataFrame(table)
