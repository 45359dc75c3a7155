"""Convergence and fit diagnostics of a posterior, with stated quality gates.

:func:`diagnose` reads a fitted :class:`xarray.DataTree` (the ``result`` of
:class:`~bayes_latency.model.estimator.LatencyModel`) and checks:

- rank-normalised split R-hat, bulk and tail ESS of every posterior variable (worst value per
  variable, and per (config, term) cell for ``beta`` and ``alpha``);
- sampler statistics: divergences, E-BFMI per chain, share of transitions that saturated the
  maximum tree depth (nutpie and PyMC names are both understood);
- PSIS-LOO with Pareto-k when a ``log_likelihood`` group exists (a warning gate only).

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
    return {
        "elpd": float(res.elpd),
        "se": float(res.se),
        "p": float(res.p),
        "n_obs": int(k.size),
        "n_samples": int(res.n_samples),
        "n_k_high": n_high,
        "share_k_high": n_high / max(k.size, 1),
        "max_k": float(np.nanmax(k)) if k.size else np.nan,
    }


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

    return DiagnosticsReport(
        passed=not failures, failures=failures, warnings=warns, gates=gates, table=table,
        cells=cells, sampler=sampler, loo=loo, approximate=approximate, attrs=attrs,
        thresholds=th,
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
        table = azs.compare(trees, round_to="none")
    return pd.DataFrame(table)


# --------------------------------------------------------------------------------------------
# CLI


def _read_table(folder: Path, name: str) -> pd.DataFrame | None:
    for cand in (folder / f"{name}.parquet", folder / f"{name}.csv"):
        if cand.is_file():
            return pd.read_parquet(cand) if cand.suffix == ".parquet" else pd.read_csv(cand)
    return None


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
        obs = pd.read_parquet(tables) if tables.suffix == ".parquet" else pd.read_csv(tables)
    else:
        obs = _read_table(folder, "observations")
    if obs is None:
        raise BayesLatencyError(f"no observations table in {tables}")
    requests = _read_table(folder, "requests")
    lifecycle = _read_table(folder, "lifecycle")
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    step_rows = obs[obs["kind"].isin(ppc.STEP_KINDS)].reset_index(drop=True)
    if len(step_rows):
        draws = model.sample_posterior_predictive(step_rows, seed=seed)
        rows = ppc.ppc_rows(step_rows, draws, kinds=ppc.STEP_KINDS)
        summary = ppc.summarize_rows(rows, by=ppc.STEP_GROUPS)
        written["step_ppc"] = _write_csv(summary, out / "step_ppc.csv")
        written["step_rows"] = _write_csv(rows, out / "step_ppc_rows.csv")
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
        written["workload_scatter"] = plots.plot_observed_vs_predicted(
            wl, out / "workload_observed_vs_predicted.png", facet="metric",
            predicted="pred_median_us",
            title="Workload means: observed vs predicted (90% band)")
    # adequacy gate: LOO-PIT and band coverage of the fitted rows, workload means (a model
    # without posterior coefficient draws is judged on the in-sample PIT of the step check)
    if hasattr(model, "design") and hasattr(model, "coefficients"):
        fitted = obs[obs["config_id"].isin(set(model.design.configs.index))]
        step_rows = adequacy.step_checks(model, fitted, seed=seed)
    else:
        step_rows = rows if len(step_rows) else None
    adq = adequacy.assess(step_rows, wl)
    (out / "adequacy.md").write_text(adq.to_markdown())
    written["adequacy"] = out / "adequacy.json"
    written["adequacy"].write_text(json.dumps(adq.to_dict(), indent=2) + "\n")
    return written


def _write_csv(df: pd.DataFrame, path: Path) -> Path:
    df.to_csv(path, index=False)
    return path


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
    from bayes_latency.model.estimator import LatencyModel

    model = LatencyModel.load(args.posterior)
    report = diagnose(model.result)
    print(report.to_markdown())
    out = Path(args.out) if getattr(args, "out", None) else None
    tables = getattr(args, "tables", None)
    if tables and out is None:
        out = Path(args.posterior).resolve().parent / "check"
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "diagnostics.md").write_text(report.to_markdown() + "\n")
        (out / "diagnostics.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        from bayes_latency.checks.plots import plot_forest

        plot_forest(model.result, out / "forest.png")
    if tables:
        written = run_checks(model, Path(tables), out)
        print("\n## Predictive checks\n")
        for name, path in written.items():
            print(f"- {name}: {path}")
        if "workload_ppc" in written:
            wl = pd.read_csv(written["workload_ppc"])
            e2e = wl[(wl["metric"] == "e2e_mean") & (wl["stage"].astype(str) == "all")]
            print("\nmean E2E error per experiment (target < 10%):")
            for r in e2e.itertuples():
                print(f"- {r.experiment_id}: {r.error_pct:+.1f}% "
                      f"(observed {r.observed_us / 1e3:.1f} ms, predicted {r.pred_median_us / 1e3:.1f} ms "
                      f"[{r.q05_us / 1e3:.1f}, {r.q95_us / 1e3:.1f}])")
        adq = json.loads(written["adequacy"].read_text())
        if adq["passed"]:
            print("\nadequacy gate: passed (LOO-PIT, band coverage, workload means)")
        else:
            print("\nadequacy gate: FAILED, the model does not explain these data:")
            for f in adq["failures"]:
                print(f"- {f}")
            return 1
    return 0 if report.passed else 1
