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

:func:`check_command` is the ``bayes-latency check`` subcommand.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

SAMPLE_DIMS = ("chain", "draw")
CELL_VARIABLES = ("beta", "alpha")
"""Posterior variables whose R-hat / ESS are also reported per (config, term) cell."""

_TREE_FLAGS = ("reached_max_treedepth", "maxdepth_reached")
_TREE_DEPTH = ("tree_depth", "depth")
_MAX_DEPTH_ATTRS = ("max_treedepth", "maxdepth", "max_tree_depth")


@dataclass(frozen=True)
class Thresholds:
    """Quality gates of :func:`diagnose`.

    Attributes
    ----------
    max_rhat
        Largest acceptable rank-normalised split R-hat (default 1.01, Vehtari et al. 2021).
    min_ess_bulk, min_ess_tail
        Smallest acceptable bulk and tail effective sample sizes (default 400 each).
    max_divergences
        Largest acceptable number of divergent transitions (default 0).
    min_ebfmi
        Smallest acceptable E-BFMI of any chain (default 0.3).
    max_treedepth_share
        Largest acceptable share of transitions that hit the maximum tree depth (default 0.01).
    pareto_k
        Pareto-k above which a PSIS-LOO observation is unreliable (default 0.7).
    max_pareto_k_share
        Largest share of observations with k above ``pareto_k`` before a *warning* (default 0.01).
        This gate never fails a report.
    """

    max_rhat: float = 1.01
    min_ess_bulk: float = 400.0
    min_ess_tail: float = 400.0
    max_divergences: int = 0
    min_ebfmi: float = 0.3
    max_treedepth_share: float = 0.01
    pareto_k: float = 0.7
    max_pareto_k_share: float = 0.01


@dataclass
class Gate:
    """One quality gate: its measured value, threshold and status.

    ``status`` is one of ``"pass"``, ``"fail"``, ``"warn"``, ``"n/a"`` or ``"n/a (approximate)"``.
    """

    name: str
    value: str
    threshold: str
    status: str
    detail: str = ""


@dataclass
class DiagnosticsReport:
    """Result of :func:`diagnose`.

    Attributes
    ----------
    passed
        True when no gate has status ``"fail"``.
    failures
        One line per failed gate (empty when ``passed``).
    warnings
        Lines for warning gates and for things that could not be checked.
    gates
        Every gate with value, threshold and status.
    table
        One row per posterior variable: ``size, rhat_max, ess_bulk_min, ess_tail_min`` and the
        location of the worst R-hat (``rhat_worst``).
    cells
        One row per (variable, config, term) of ``beta`` / ``alpha``: ``rhat, ess_bulk, ess_tail``.
    sampler
        Sampler statistics (``n_chains, n_draws, divergences, ebfmi, treedepth_share``).
    loo
        PSIS-LOO summary (``elpd, se, p, n_obs, n_k_high, share_k_high, max_k``) or None.
    approximate
        True when the posterior comes from an approximate method.
    attrs
        Provenance attributes of the result (method, sampler, hashes, versions).
    thresholds
        The thresholds used.
    """

    passed: bool
    failures: list[str]
    warnings: list[str]
    gates: list[Gate]
    table: pd.DataFrame
    cells: pd.DataFrame
    sampler: dict[str, Any]
    loo: dict[str, Any] | None
    approximate: bool
    attrs: dict[str, Any] = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    sensitivity: pd.DataFrame | None = None
    identifiability: list[dict[str, Any]] | None = None

    def gates_frame(self) -> pd.DataFrame:
        """The gates as a DataFrame (one row per gate)."""
        return pd.DataFrame([asdict(g) for g in self.gates])

    def to_markdown(self) -> str:
        """Human-readable report (GitHub markdown)."""
        lines = ["# Posterior diagnostics", ""]
        if self.approximate:
            lines += [
                "> **APPROXIMATE POSTERIOR** (method "
                f"`{self.attrs.get('method', '?')}`, sampler `{self.attrs.get('sampler', '?')}`): "
                "draws do not come from Markov chains, so R-hat and ESS do not apply and are "
                "reported as n/a. Intervals are only as good as the approximation.",
                "",
            ]
        verdict = "PASSED" if self.passed else "FAILED"
        lines += [f"**Result: {verdict}**", ""]
        if self.attrs:
            lines += ["| attribute | value |", "|---|---|"]
            lines += [f"| {k} | {_cell(v)} |" for k, v in self.attrs.items()]
            lines.append("")
        lines += ["## Gates", "", _markdown_table(self.gates_frame()), ""]
        if self.failures:
            lines += ["## Failures", ""] + [f"- {f}" for f in self.failures] + [""]
        if self.warnings:
            lines += ["## Warnings", ""] + [f"- {w}" for w in self.warnings] + [""]
        if not self.table.empty:
            lines += ["## Per variable", "", _markdown_table(self.table.reset_index()), ""]
        if self.loo is not None:
            lines += ["## PSIS-LOO", ""]
            lines += [f"- {k}: {_fmt(v)}" for k, v in self.loo.items()]
            lines.append("")
        if self.identifiability is not None:
            from bayes_latency.data.identifiability import IdentifiabilityReport

            ident = IdentifiabilityReport.from_dict(self.identifiability)
            lines += ["## Identifiability", "", "```", ident.summary(), "```", ""]
        if self.sensitivity is not None and not self.sensitivity.empty:
            lines += ["## Prior sensitivity", "",
                      f"Power-scaling sensitivity (arviz_stats.psense_summary) of the population "
                      f"coefficients: above {SENSITIVITY_THRESHOLD} the posterior moves when the "
                      "prior (or the likelihood) is scaled. *prior-dominated*: the data say "
                      "little and the prior decides; *data-dominated*: the likelihood decides; "
                      "*prior-data conflict*: both matter.", "",
                      _markdown_table(self.sensitivity.reset_index()), ""]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form of the report."""
        return jsonable({
            "passed": self.passed,
            "approximate": self.approximate,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "gates": [asdict(g) for g in self.gates],
            "thresholds": asdict(self.thresholds),
            "sampler": self.sampler,
            "loo": self.loo,
            "attrs": self.attrs,
            "variables": self.table.reset_index().to_dict(orient="records"),
            "identifiability": self.identifiability,
            "prior_sensitivity": (None if self.sensitivity is None else
                                  self.sensitivity.reset_index().to_dict(orient="records")),
        })


# --------------------------------------------------------------------------------------------
# helpers


def _fmt(v: Any) -> str:
    if isinstance(v, float | np.floating):
        if not np.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    return str(v)


def _cell(v: Any) -> str:
    return _fmt(v).replace("|", "\\|")


def _markdown_table(df: pd.DataFrame) -> str:
    """Render a DataFrame as a markdown table (no dependency on ``tabulate``)."""
    cols = [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(out)


def jsonable(obj: Any) -> Any:
    """Recursively convert numpy scalars / arrays and paths to plain JSON / YAML types
    (non-finite floats become None)."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | np.ndarray):
        return [jsonable(v) for v in (obj.tolist() if isinstance(obj, np.ndarray) else obj)]
    if isinstance(obj, np.bool_ | bool):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating | float):
        f = float(obj)
        return f if np.isfinite(f) else None
    if isinstance(obj, Path | np.str_):
        return str(obj)
    return obj


def is_approximate(result: xr.DataTree | Mapping[str, Any]) -> bool:
    """True when ``result.attrs["approximate"]`` (or ``result["approximate"]`` for a mapping of
    attributes) says the posterior is approximate (``"true"``, ``True``)."""
    attrs = result.attrs if isinstance(result, xr.DataTree) else result
    flag = attrs.get("approximate", "false")
    if isinstance(flag, str):
        return flag.strip().lower() in ("true", "1", "yes")
    return bool(flag)


def _group(result: xr.DataTree, name: str) -> xr.Dataset | None:
    if name not in result.children:
        return None
    ds = result[name].to_dataset()
    return ds if (ds.data_vars or ds.coords) else None


def _numeric_posterior(post: xr.Dataset) -> xr.Dataset:
    keep = [v for v in post.data_vars
            if np.issubdtype(post[v].dtype, np.number) and set(SAMPLE_DIMS) <= set(post[v].dims)]
    return post[keep]


def _label(da: xr.DataArray, flat_index: int) -> str:
    """``var[dim=coord, ...]`` of the element at ``flat_index`` of ``da``."""
    if not da.dims:
        return str(da.name)
    idx = np.unravel_index(flat_index, da.shape)
    parts = []
    for dim, i in zip(da.dims, idx, strict=True):
        coord = da[dim].values[i] if dim in da.coords else i
        parts.append(f"{dim}={coord}")
    return f"{da.name}[{', '.join(parts)}]"


def log_likelihood_tree(result: xr.DataTree, var_name: str | None = None) -> xr.DataTree | None:
    """A small DataTree with ``posterior`` and ``log_likelihood`` groups ready for ArviZ LOO.

    Handles a log-likelihood variable that xarray stored as a *coordinate* because it has the
    same name as one of its dimensions (``obs (chain, draw, obs)``): it is renamed to a data
    variable over ``obs_idx``. Only ``beta``/``alpha`` are kept in the posterior (they are used for
    the relative efficiency), falling back to all variables.

    Returns
    -------
    DataTree or None
        None when there is no usable log-likelihood.
    """
    ll = _group(result, "log_likelihood")
    post = _group(result, "posterior")
    if ll is None or post is None:
        return None
    candidates = {}
    for name, var in list(ll.data_vars.items()) + list(ll.coords.items()):
        if set(SAMPLE_DIMS) <= set(var.dims) and var.ndim > 2:
            candidates[str(name)] = var
    if not candidates:
        return None
    if var_name is None:
        var_name = "obs" if "obs" in candidates else sorted(candidates)[0]
    if var_name not in candidates:
        return None
    var = candidates[var_name]
    dims = tuple(d if d in SAMPLE_DIMS or d != var_name else f"{d}_idx" for d in var.dims)
    da = xr.DataArray(np.asarray(var.values), dims=dims,
                      coords={d: ll[d].values for d in SAMPLE_DIMS if d in ll.coords})
    small = [v for v in CELL_VARIABLES if v in post.data_vars] or list(post.data_vars)
    return xr.DataTree.from_dict({
        "posterior": _numeric_posterior(post[small]),
        "log_likelihood": xr.Dataset({var_name: da}),
    })


# --------------------------------------------------------------------------------------------
# prior sensitivity

#: Power-scaling sensitivity above which prior or likelihood "matters" (Kallioinen et al. 2024,
#: the default of :func:`arviz_stats.psense_summary`).
SENSITIVITY_THRESHOLD = 0.05


#: Log-prior variables power-scaled by :func:`prior_sensitivity`: the coefficient priors of
#: ``priors/*.yaml`` (roofline medians and ARD, both in ``z_pop``). Power-scaling every prior of a
#: hierarchy (the standardised effects too) moves every coefficient and says little about the
#: priors a user sets; the priorsense authors advise scaling the top-level priors.
COEFFICIENT_PRIORS = ("z_pop", "z_config")


def _verdict(prior: float, lik: float, thr: float) -> str:
    if prior >= thr and lik >= thr:
        return "prior-data conflict"
    if prior >= thr:
        return "prior-dominated"
    if lik >= thr:
        return "data-dominated"
    return "insensitive"


def prior_sensitivity(result: xr.DataTree, var_name: str = "mu",
                      threshold: float = SENSITIVITY_THRESHOLD) -> pd.DataFrame | None:
    """Which coefficients the priors dominate and which the data do (power-scaling).

    Calls :func:`arviz_stats.psense_summary` on the population log-coefficient ``var_name``
    (one value per coefficient; the configurations' ``beta`` / ``alpha`` inherit it) and adds
    the power-scaling sensitivity of ``beta`` / ``alpha`` (largest over configurations). The
    prior power-scaled is that of the coefficients (:data:`COEFFICIENT_PRIORS`: roofline prior
    medians and ARD), the likelihood that of every row in ``log_likelihood``.

    Returns
    -------
    DataFrame or None
        Index ``coef``; columns ``prior``, ``likelihood`` (sensitivities of ``var_name``),
        ``config_prior_max``, ``config_likelihood_max`` and ``verdict`` (``prior-dominated``,
        ``data-dominated``, ``prior-data conflict`` or ``insensitive``). None when the result
        has no ``log_prior`` / ``log_likelihood`` group or no ``var_name``.
    """
    post = _group(result, "posterior")
    if (post is None or var_name not in post or _group(result, "log_prior") is None
            or _group(result, "log_likelihood") is None):
        return None
    import logging

    import arviz_stats as azs

    lp = _group(result, "log_prior")
    prior_vars = [v for v in COEFFICIENT_PRIORS if v in lp.data_vars] or None

    log = logging.getLogger("arviz_stats.psense")
    level = log.level
    log.setLevel(logging.ERROR)  # its "potential issues" warning is what this table reports
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tab = azs.psense_summary(result, var_names=[var_name], threshold=threshold,
                                     prior_var_names=prior_vars, round_to=6)
            cells = {}
            for v in CELL_VARIABLES:
                if v in post:
                    cells[v] = {g: azs.psense(result, var_names=[v], group=g,
                                              group_var_names=prior_vars if g == "prior" else None)[v]
                                for g in ("prior", "likelihood")}
    finally:
        log.setLevel(level)
    coefs = [str(c) for c in post[var_name]["coef"].values] if "coef" in post[var_name].dims \
        else [str(i) for i in range(len(tab))]
    out = pd.DataFrame({"coef": coefs,
                        "prior": tab["prior"].to_numpy(dtype=float),
                        "likelihood": tab["likelihood"].to_numpy(dtype=float)}).set_index("coef")
    for by in cells.values():
        tdim = next(d for d in by["prior"].dims if d != "config")
        for g, col in (("prior", "config_prior_max"), ("likelihood", "config_likelihood_max")):
            mx = by[g].max("config") if "config" in by[g].dims else by[g]
            for t, val in zip(mx[tdim].values, mx.values, strict=True):
                out.loc[str(t), col] = float(val)
    out["verdict"] = [_verdict(p, q, threshold) for p, q in zip(out["prior"], out["likelihood"],
                                                                  strict=True)]
    return out


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


# --------------------------------------------------------------------------------------------
# CLI


def _read_file(path: Path) -> pd.DataFrame:
    """A Parquet or CSV table; a corrupt file is a one-line error naming it."""
    from bayes_latency.errors import TraceFormatError
    from bayes_latency.io import read_parquet

    if path.suffix == ".parquet":
        return read_parquet(path)
    try:
        return pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - any parser failure is a bad file for the user
        raise TraceFormatError(f"cannot read CSV table: {exc}", file=str(path)) from None


def _read_table(folder: Path, name: str) -> pd.DataFrame | None:
    from bayes_latency.data.tables import read_table, table_files

    if table_files(folder, name):  # ingest's layout (partitioned, or one Parquet file)
        return read_table(folder, name)
    cand = folder / f"{name}.csv"
    return _read_file(cand) if cand.is_file() else None


def run_checks(model: Any, tables: Path, out: Path, seed: int = 0) -> dict[str, Path]:
    """Run the step, request and workload predictive checks and write tables and plots.

    Parameters
    ----------
    model
        A fitted :class:`~bayes_latency.model.estimator.LatencyModel`.
    tables
        Folder written by ``bayes-latency ingest`` (``observations``, ``requests`` and optionally
        ``lifecycle`` tables, Parquet or CSV); a path to an observations file also works.
    out
        Output folder (created).
    seed
        Seed of the posterior predictive draws.

    Returns
    -------
    dict
        Name -> written file.
    """
    from bayes_latency.checks import adequacy, plots, ppc
    from bayes_latency.errors import BayesLatencyError

    tables = Path(tables)
    folder = tables if tables.is_dir() else tables.parent
    if tables.is_file():
        obs = _read_file(tables)
    else:
        obs = _read_table(folder, "observations")
    if obs is None:
        raise BayesLatencyError(f"no observations table in {tables}")
    from bayes_latency.data.observations import validate_observations

    validate_observations(obs, source=str(tables))
    requests = _read_table(folder, "requests")
    lifecycle = _read_table(folder, "lifecycle")
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    from bayes_latency.checks.sanity import prediction_findings

    findings: list[str] = []  # non-finite / absurd predictions: reported, never plotted
    step_rows = obs[obs["kind"].isin(ppc.STEP_KINDS)].reset_index(drop=True)
    if len(step_rows):
        draws = model.sample_posterior_predictive(step_rows, seed=seed)
        bad = prediction_findings("step rows", step_rows["value_us"], draws.values)
        findings += bad
        rows = ppc.ppc_rows(step_rows, draws, kinds=ppc.STEP_KINDS)
        summary = ppc.summarize_rows(rows, by=ppc.STEP_GROUPS)
        written["step_ppc"] = _write_csv(summary, out / "step_ppc.csv")
        written["step_rows"] = _write_csv(rows, out / "step_ppc_rows.csv")
    if len(step_rows) and not bad:
        written["ppc_plot"] = plots.plot_ppc_iterations(step_rows, draws,
                                                        out / "ppc_iterations.png")
        written["pit_plot"] = plots.plot_pit(step_rows, draws, out / "pit.png",
                                             kinds=ppc.STEP_KINDS)
        written["calibration_plot"] = plots.plot_calibration(rows, out / "calibration.png")
        written["step_scatter"] = plots.plot_observed_vs_predicted(
            rows, out / "step_observed_vs_predicted.png", title="Steps: observed vs predicted")
    wl = None
    if requests is not None and len(requests):
        req = ppc.request_ppc(model, obs, requests, seed=seed)
        written["request_ppc"] = _write_csv(req.summary(), out / "request_ppc.csv")
        written["request_rows"] = _write_csv(req.rows, out / "request_ppc_rows.csv")
        wl = ppc.workload_ppc(req, lifecycle=lifecycle)
        written["workload_ppc"] = _write_csv(wl, out / "workload_ppc.csv")
        bad = (prediction_findings("request rows", req.rows["observed_us"],
                                   req.rows["pred_mean_us"]) if len(req.rows) else [])
        bad += prediction_findings("workload means", wl["observed_us"], wl["pred_mean_us"]) \
            if len(wl) and "observed_us" in wl else []
        findings += bad
        if not bad:
            written["workload_scatter"] = plots.plot_observed_vs_predicted(
                wl, out / "workload_observed_vs_predicted.png", facet="metric",
                predicted="pred_median_us",
                title="Workload means: observed vs predicted (90% band)")
    if findings:
        written["findings"] = _write_text(out / "findings.json",
                                          json.dumps(findings, indent=2) + "\n")
    # adequacy gate: LOO-PIT and band coverage of the fitted rows, workload means (a model
    # without posterior coefficient draws is judged on the in-sample PIT of the step check)
    if hasattr(model, "design") and hasattr(model, "coefficients"):
        fitted = obs[obs["config_id"].isin(set(model.design.configs.index))]
        step_rows = adequacy.step_checks(model, fitted, seed=seed)
    else:
        step_rows = rows if len(step_rows) else None
    adq = adequacy.assess(step_rows, wl)
    _write_text(out / "adequacy.md", adq.to_markdown())
    written["adequacy"] = _write_text(out / "adequacy.json",
                                      json.dumps(adq.to_dict(), indent=2) + "\n")
    return written


def _write_csv(df: pd.DataFrame, path: Path) -> Path:
    from bayes_latency.io import atomic_write

    return atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


def _write_text(path: Path, text: str) -> Path:
    from bayes_latency.io import atomic_write_text

    return atomic_write_text(path, text)


def check_command(args: argparse.Namespace) -> int:
    """``bayes-latency check posterior.nc [--tables DIR] [--out DIR]``.

    Loads the posterior, prints the diagnostics report and, with ``--out``, writes
    ``diagnostics.md`` / ``diagnostics.json`` and the coefficient forest plot ``forest.png`` there. With ``--tables`` it also runs the predictive
    checks and writes their tables and plots (into ``--out``, default ``<posterior dir>/check``).

    Returns
    -------
    int
        1 when a diagnostics gate or (with ``--tables``) the adequacy gate of
        :mod:`~bayes_latency.checks.adequacy` fails, 0 otherwise.
    """
    from bayes_latency.checks.sanity import coefficient_findings, load_posterior
    from bayes_latency.io import check_output_path

    out = Path(args.out) if getattr(args, "out", None) else None
    tables = getattr(args, "tables", None)
    priors = getattr(args, "priors", None)
    if tables and out is None:
        out = Path(args.posterior).resolve().parent / "check"
    if out is not None:  # before loading: a bad --out fails at once
        check_output_path(out, [p for p in (args.posterior, tables, priors) if p], kind="dir",
                          names=("diagnostics.md", "diagnostics.json", "findings.json"))
    model = load_posterior(args.posterior, priors=priors)
    report = diagnose(model.result)
    print(report.to_markdown())
    findings = coefficient_findings(model.result)
    if out is not None:
        _write_text(out / "diagnostics.md", report.to_markdown() + "\n")
        _write_text(out / "diagnostics.json", json.dumps(report.to_dict(), indent=2) + "\n")
        from bayes_latency.checks.plots import plot_forest

        if not findings:
            plot_forest(model.result, out / "forest.png")
    written: dict[str, Path] = {}
    adequacy_failed = False
    if tables and not findings:
        written = run_checks(model, Path(tables), out)
        print("\n## Predictive checks\n")
        for name, path in written.items():
            print(f"- {name}: {path}")
        if "workload_ppc" in written:
            wl = pd.read_csv(written["workload_ppc"])
            e2e = wl[(wl["metric"] == "e2e_mean") & (wl["stage"].astype(str) == "all")]
            print("\nmean E2E error per experiment (target < 10%):")
            for r in e2e.itertuples():
                vals = (r.observed_us, r.pred_mean_us, r.q05_us, r.q95_us)
                if not (np.all(np.isfinite(vals)) and abs(r.pred_mean_us) < 1e6 * abs(
                        r.observed_us)):
                    print(f"- {r.experiment_id}: prediction not finite or absurd (see findings)")
                    continue
                print(f"- {r.experiment_id}: {r.error_pct:+.1f}% "
                      f"(observed {r.observed_us / 1e3:.1f} ms, predicted {r.pred_median_us / 1e3:.1f} ms "
                      f"[{r.q05_us / 1e3:.1f}, {r.q95_us / 1e3:.1f}])")
        adq = json.loads(written["adequacy"].read_text())
        adequacy_failed = not adq["passed"]
        if adq["passed"]:
            print("\nadequacy gate: passed (LOO-PIT, band coverage, workload means)")
        else:
            print("\nadequacy gate: FAILED, the model does not explain these data:")
            for f in adq["failures"]:
                print(f"- {f}")
    if "findings" in written:
        findings += json.loads(written["findings"].read_text())
    if findings:
        print("\n## Findings (exit 1)\n")
        for f in findings:
            print(f"- {f}")
        if out is not None:
            _write_text(out / "findings.json", json.dumps(findings, indent=2) + "\n")
        return 1
    if adequacy_failed:
        return 1
    return 0 if report.passed else 1
