"""The fitted result as a file: its layout and attrs, saving, reading and the checks on reading.

:func:`table_rows` and :func:`rows_hash` give a fit's rows and their data hash (and
:func:`checked_rows` the rows of a table that must hash like a fit's); :func:`assemble` lays out
the result DataTree of a fit (``posterior``, ``sample_stats``, ``constant_data``, ``summaries``)
and its attrs (versions, priors hash and YAML, data hash, model configuration, sampler settings);
:func:`save_result` writes it (thinned, float32 draws, compressed) and
:func:`posterior_with_fixed` gives the posterior with the model's fixed quantities. :func:`read_result` reads a file back,
refusing another model version, with the priors it embeds; :func:`check_priors` refuses priors
that differ from the fit's (:class:`~bayes_latency.errors.ModelMismatchError`), and
:func:`configs_table` and :func:`restored_attrs` give what the file says about the fit.

Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency import MODEL_VERSION, __version__
from bayes_latency.data.observations.build import DEFAULT_STACK
from bayes_latency.data.observations.table import faster_than_peak_compute
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import BayesLatencyError, ConfigError, ModelMismatchError
from bayes_latency.model.definition.identifiability import IdentifiabilityReport
from bayes_latency.model.definition.likelihood import load_refs, noise_kind
from bayes_latency.model.definition.rows import feature_columns, fit_rows

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.model.posterior.state import FitState


def _priors_yaml(priors: object) -> str:
    """The validated prior content as YAML (embedded in the result so a fit reloads alone)."""
    import yaml

    return yaml.safe_dump(priors.content(), sort_keys=False, allow_unicode=True)


def _hash_frame(df: pd.DataFrame) -> str:
    h = pd.util.hash_pandas_object(df.reset_index(drop=True), index=False).to_numpy()
    return hashlib.sha256(h.tobytes()).hexdigest()[:16]


def table_rows(observations: pd.DataFrame, coefs: tuple[str, ...] | list[str],
               report: IngestReport | None = None) -> pd.DataFrame:
    """The rows a fit is made on (:func:`~bayes_latency.model.definition.rows.fit_rows`, drops
    counted in ``report``), with the default serving stack where the table has no ``stack``
    column (tables written before the stack level existed)."""
    rows = fit_rows(observations, report, coefs)
    if "stack" not in rows.columns:
        rows = rows.assign(stack=DEFAULT_STACK)
    return rows


def physical_rows(observations: pd.DataFrame, rows: pd.DataFrame,
                  report: IngestReport | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``rows`` (:func:`table_rows` of ``observations``) without the rows measured faster than
    their GPU's peak compute (:func:`~bayes_latency.data.observations.table.faster_than_peak_compute`:
    no GPU can have measured them, so they are not the GPU time the model explains), and those
    rows; the drop is counted in ``report``. What every fit leaves out, and what a loaded fit's
    rows are checked against (:func:`checked_rows`)."""
    fitted = (observations[observations["obs_id"].isin(rows["obs_id"])]
              if "obs_id" in observations.columns and "obs_id" in rows.columns else observations)
    fast = faster_than_peak_compute(fitted)
    if len(fast) and "obs_id" in rows.columns:
        rows = rows[~rows["obs_id"].isin(fast["obs_id"])].reset_index(drop=True)
        if report is not None:
            report.drop("faster than the GPU's peak compute", len(fast))
    return rows, fast


def rows_hash(rows: pd.DataFrame, coefs: tuple[str, ...] | list[str]) -> str:
    """The data hash of a fit's rows (kept in the result's ``data_hash``)."""
    return _hash_frame(rows[["config_id", "kind", "value_us", "n_steps"] + feature_columns(coefs)])


#: HDF5 filters of every numeric variable of a saved netCDF file (h5netcdf encoding).
COMPRESSION = {"compression": "gzip", "compression_opts": 4, "shuffle": True}


def constant_data(state: FitState, fixed: xr.Dataset | None = None) -> xr.Dataset:
    """``constant_data``: the configuration table (``config_llm``, ``config_gpu``, ``config_tp``,
    ``config_stack`` on ``config``), the unit and kind (beta / alpha) of each coefficient
    (``coef_unit``, ``coef_kind``, ``term_unit``, ``alpha_term_unit``) and the fixed quantities of
    the model (``fixed``: the same at every draw, e.g. the scales ``sigma_<factor>`` of a
    two-level factor), listed in attrs ``fixed_posterior_variables``."""
    from bayes_latency.model.posterior.groups import annotate, coef_units

    d = state.design
    const = xr.Dataset(
        {"config_llm": ("config", d.configs["model"].to_numpy().astype(str)),
         "config_gpu": ("config", d.configs["gpu"].to_numpy().astype(str)),
         "config_tp": ("config", d.configs["tp"].to_numpy().astype(int)),
         "config_stack": ("config", d.configs["stack"].to_numpy().astype(str)),
         "coef_unit": ("coef", coef_units(state.coefs)),
         "coef_kind": ("coef", ["beta" if c in state.terms else "alpha" for c in state.coefs]),
         "term_unit": ("term", coef_units(state.terms)),
         "alpha_term_unit": ("alpha_term", coef_units(state.alpha_terms))},
        coords={"config": list(d.configs.index), "coef": list(state.coefs),
                "term": list(state.terms), "alpha_term": list(state.alpha_terms)})
    names: list[str] = []
    if fixed is not None:
        for v in fixed.data_vars:
            const[v] = fixed[v]
            const[v].attrs["fixed"] = "the same value at every posterior draw (not sampled)"
            names.append(str(v))
    const.attrs["fixed_posterior_variables"] = json.dumps(names)
    return annotate(const)


def posterior_with_fixed(result: xr.DataTree) -> xr.Dataset:
    """The posterior with the fixed quantities of ``constant_data`` broadcast over the draws and
    the fixed (NaN) elements of its variables at their values (:func:`~bayes_latency.model.definition.design.filled`:
    ``eff_<factor>`` 0 on the terms without the factor, ``relevance`` 1 without ARD gate,
    ``sigma_config`` at ``sigma_config_fixed``), as the model has them (what :mod:`bayes_latency.model.posterior.unseen`
    and :mod:`bayes_latency.model.posterior.predict` read)."""
    from bayes_latency.model.definition.design import filled

    post = result["posterior"].to_dataset()
    const = (result["constant_data"].to_dataset() if "constant_data" in result.children
             else xr.Dataset())
    fills = {"sigma_config": float(const["sigma_config_fixed"])
             if "sigma_config_fixed" in const else None}
    post = post.assign({v: filled(post[v], fills.get(str(v))) for v in post.data_vars
                        if v in fills or v == "relevance" or str(v).startswith("eff_")})
    if "constant_data" not in result.children:
        return post
    fixed = [v for v in json.loads(const.attrs.get("fixed_posterior_variables", "[]"))
             if v not in post]
    if not fixed:
        return post
    sample = xr.Dataset(coords={"chain": post["chain"], "draw": post["draw"]})
    return post.assign({v: const[v].reset_coords(drop=True).broadcast_like(sample)
                        .transpose("chain", "draw", ...) for v in fixed})


def assemble(state: FitState, dt: xr.DataTree, rows: pd.DataFrame, *,
             timings: dict[str, float], report: IngestReport,
             settings: dict[str, Any]) -> xr.DataTree:
    """The result DataTree of a fit from the sampler's draws ``dt``, with its attrs.

    No group of draws has a non-index coordinate (ArviZ's ``summary`` and ``psense_summary``
    concatenate per-variable results and refuse a coordinate only some variables carry): the
    configuration table, the units and the model's fixed quantities are ``constant_data``
    (:func:`constant_data`).
    """
    from bayes_latency.model.posterior.groups import annotate

    groups: dict[str, xr.Dataset] = {"posterior": annotate(dt["posterior"].to_dataset())}
    if "sample_stats" in dt:
        ss = dt["sample_stats"].to_dataset()
        ss = ss.drop_vars([v for v in ss.data_vars if ss[v].dtype == object])
        groups["sample_stats"] = ss
    fixed = dt["constant_data"].to_dataset() if "constant_data" in dt.children else None
    groups["constant_data"] = constant_data(state, fixed)
    groups["summaries"] = noise_dataset(state, rows)
    out = xr.DataTree.from_dict(groups)
    terms = list(state.terms)
    out.attrs.update({
        "bayes_latency_version": __version__, "model_version": MODEL_VERSION,
        "priors_hash": state.priors.hash, "data_hash": state.data_hash,
        "terms": json.dumps(terms), "alpha_terms": json.dumps(list(state.alpha_terms)),
        "method": state.method, "variant": state.variant, "sampler": state.sampler,
        "noise_load": state.noise_load,
        "approximate": "true" if state.sampler == "laplace" else "false",
        "timings": json.dumps(timings), "fit_report": json.dumps(report.to_dict()),
        "priors_yaml": _priors_yaml(state.priors), "priors_path": str(state.priors.path),
        "model_config": json.dumps({"terms": terms, "method": state.method,
                                    "variant": state.variant, "sampler": state.sampler}),
    })
    if state.identifiability is not None:
        out.attrs["identifiability"] = json.dumps(state.identifiability.to_dict())
    if settings:
        out.attrs["sampler_settings"] = json.dumps(settings)
    return out


def noise_dataset(state: FitState, rows: pd.DataFrame) -> xr.Dataset:
    """Noise parameters per (config, kind) and, on the fast path, the stage-1 summaries."""
    cfgs = list(state.design.configs.index)
    noise = state.noise
    kinds = sorted({k for n in noise.values() for k in n} | set(noise_kind(rows)))
    arr = {w: np.full((len(cfgs), len(kinds)), np.nan)
           for w in ("sigma", "tau", "nu", "gamma", "load_ref")}
    # the reference loads of the rows (the full path's; stage 1 computes the same ones)
    refs = load_refs(rows, state.noise_load)
    for i, c in enumerate(cfgs):
        for j, k in enumerate(kinds):
            arr["load_ref"][i, j] = refs.get((c, k), np.nan)
            p = noise.get(c, {}).get(k)
            if p is not None:
                arr["sigma"][i, j], arr["tau"][i, j], arr["nu"][i, j] = p.sigma, p.tau, p.nu
                arr["gamma"][i, j], arr["load_ref"][i, j] = p.gamma, p.load_ref
    ds = xr.Dataset({f"noise_{w}": (("config", "kind"), a) for w, a in arr.items()},
                    coords={"config": cfgs, "kind": kinds})
    ds.attrs["noise_load"] = state.noise_load
    if state.summaries:
        by = {s.config_id: s for s in state.summaries}
        ds["theta_hat"] = (("config", "coef"), np.stack([by[c].theta_hat for c in cfgs]))
        ds["grad"] = (("config", "coef"), np.stack([by[c].grad for c in cfgs]))
        ds["info"] = (("config", "coef", "coef2"), np.stack([by[c].info for c in cfgs]))
        ds = ds.assign_coords(coef=list(state.coefs), coef2=list(state.coefs))
        ds = ds.merge(run_effects_dataset(state.summaries))
    return ds


def run_effects_dataset(summaries: Sequence[object]) -> xr.Dataset:
    """The fitted runs and windows of every configuration
    (:mod:`bayes_latency.model.definition.runs`): ``run_config``, ``run_label``, ``run_shift``,
    ``run_shift_se`` over ``run``; ``window_run``, ``window_label``, ``window_shift``,
    ``window_shift_se`` over ``window`` (``window_run`` indexes ``run``)."""
    rc, rl, rs, rse, wr, wl, ws, wse = ([] for _ in range(8))
    for s in summaries:
        nr = len(s.runs)
        if nr + len(s.windows) == 0 or len(s.shift_hat) != nr + len(s.windows):
            continue
        base = len(rl)
        rc += [s.config_id] * nr
        rl += list(s.runs)
        rs += list(s.shift_hat[:nr])
        rse += list(s.shift_se[:nr])
        pos = {r: base + i for i, r in enumerate(s.runs)}
        wr += [pos[r] for r in s.window_run]
        wl += list(s.windows)
        ws += list(s.shift_hat[nr:])
        wse += list(s.shift_se[nr:])
    return xr.Dataset({
        "run_config": ("run", np.asarray(rc, dtype=str)),
        "run_label": ("run", np.asarray(rl, dtype=str)),
        "run_shift": ("run", np.asarray(rs, dtype=float)),
        "run_shift_se": ("run", np.asarray(rse, dtype=float)),
        "window_run": ("window", np.asarray(wr, dtype=np.int64)),
        "window_label": ("window", np.asarray(wl, dtype=str)),
        "window_shift": ("window", np.asarray(ws, dtype=float)),
        "window_shift_se": ("window", np.asarray(wse, dtype=float)),
    })


#: Groups indexed by the posterior's draws: thinned together.
DRAW_GROUPS = ("posterior", "sample_stats", "log_likelihood", "posterior_predictive", "log_prior")


def auto_thin(result: xr.DataTree) -> int:
    """The thinning that keeps at most
    :data:`~bayes_latency.model.posterior.groups.FILE_MAX_SAMPLES` posterior samples."""
    from bayes_latency.model.posterior.groups import FILE_MAX_SAMPLES

    if "posterior" not in result.children or "draw" not in result["posterior"].dims:
        return 1
    post = result["posterior"]
    S = post.sizes["draw"] * post.sizes.get("chain", 1)
    return max(1, -(-S // FILE_MAX_SAMPLES))


def encoding(dt: xr.DataTree) -> dict[str, dict]:
    """h5netcdf encoding of every group: numeric arrays compressed (:data:`COMPRESSION`), draws
    written as float32 except the model's free variables (those of ``log_prior``), kept float64:
    PyMC re-evaluating the model on the file's draws (``pm.compute_log_prior``) refuses
    zero-sum-normal values that float32 rounding moved off their constraint."""
    free = set(dt["log_prior"].data_vars) if "log_prior" in dt.children else set()
    enc: dict[str, dict] = {}
    for node in dt.subtree:
        if node is dt:
            continue
        ds = node.to_dataset(inherit=False)
        e = {}
        for v in ds.variables:
            x = ds[v]
            if x.dtype.kind not in "fiub" or x.size < 64:
                continue
            e[v] = dict(COMPRESSION)
            if (x.dtype == np.float64 and {"chain", "draw"} <= set(x.dims)
                    and not (node.name in ("posterior", "prior") and v in free)):
                e[v]["dtype"] = "float32"
        enc[node.path] = e
    return enc


def save_result(result: xr.DataTree | None, path: str | Path, thin: int | None = None) -> Path:
    """Write ``result`` to ``path``: :meth:`LatencyModel.save
    <bayes_latency.model.estimator.LatencyModel.save>` (which documents it)."""
    if result is None:
        raise BayesLatencyError("nothing to save: the model is not fitted")
    if thin is None:
        thin = auto_thin(result)
    if int(thin) < 1:
        raise ConfigError(f"thin must be >= 1, got {thin}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = result.copy()
    if int(thin) > 1:
        for g in DRAW_GROUPS:
            if g in out.children and "draw" in out[g].dims:
                out[g] = xr.DataTree(out[g].to_dataset().isel(draw=slice(None, None, int(thin))))
    out.attrs["thinned_by"] = int(thin)
    if "posterior" in out.children and "draw" in out["posterior"].dims:
        p = out["posterior"]
        out.attrs["n_samples"] = int(p.sizes["draw"] * p.sizes.get("chain", 1))
    if path.suffix == ".zarr":
        out.to_zarr(path, mode="w")
    else:
        from bayes_latency.io import write_netcdf

        write_netcdf(out, path, encoding=encoding(out))  # built in memory: a full disk is an OSError
    return path


@dataclass(frozen=True)
class SavedFit:
    """A result file read back: the DataTree, the model configuration its attrs record and the
    priors it embeds (None for a file without ``priors_yaml``)."""

    result: xr.DataTree
    terms: tuple[str, ...]
    method: str
    sampler: str
    variant: str
    embedded_priors: Any
    noise_load: str = "none"


#: Posterior variables whose draws must not be NaN, and the order of their dimensions. An
#: infinite draw (an overflowed coefficient) is read: ``check`` reports it as a finding and
#: ``export`` refuses it, each naming where it lands.
_CHECKED_VARS = {"beta": ("chain", "draw", "config", "term"),
                 "alpha": ("chain", "draw", "config", "alpha_term"),
                 "mu": ("chain", "draw", "coef")}


def _coord(ds: xr.Dataset, dim: str, want: list[str], what: str,
           owner: str = "the posterior") -> list[str] | None:
    """``want`` when ``ds`` has dimension ``dim`` with the same labels (any order), None when
    it has no such dimension; otherwise an error naming the difference (``owner``: whose
    dimension, in the message)."""
    if dim not in ds.dims:
        return None
    have = [str(v) for v in ds[dim].values] if dim in ds.coords else []
    if sorted(have) != sorted(want):
        missing = [v for v in want if v not in have]
        extra = [v for v in have if v not in want]
        raise BayesLatencyError(
            f"dimension {dim!r} of {owner} has {len(have)} labels where {what} are "
            f"{len(want)}" + (f"; missing {missing}" if missing else "")
            + (f"; unknown {extra}" if extra else ""))
    return want


def _ordered(var: xr.DataArray, want: tuple[str, ...], label: str) -> xr.DataArray:
    """``var`` with its dimensions in the order ``want``; an error naming ``label`` (``posterior
    variable beta``) when it has other dimensions."""
    if sorted(var.dims) != sorted(want):
        raise BayesLatencyError(f"{label} has dimensions {tuple(var.dims)}, expected {want}")
    return var.transpose(*want)


def checked_posterior(dt: xr.DataTree, terms: tuple[str, ...]) -> xr.DataTree:
    """``dt`` with its posterior read by dimension name: labels of ``config``, ``term``,
    ``alpha_term`` and ``coef`` in the order of the fit (``constant_data``, the attrs
    ``terms`` / ``alpha_terms``), every variable with ``chain, draw`` first, ``beta``, ``alpha``
    and ``mu`` in the order the readers take them and without NaN.

    Raises
    ------
    BayesLatencyError
        No ``chain`` / ``draw`` dimension, labels that differ from the fit's, a checked variable
        of other dimensions or with NaN draws (naming the variable).
    """
    post = dt["posterior"].to_dataset()
    for dim in ("chain", "draw"):
        if dim not in post.dims or post.sizes[dim] < 1:
            raise BayesLatencyError(f"the posterior has no {dim!r} dimension (or an empty one)")
    alpha = [str(t) for t in json.loads(dt.attrs["alpha_terms"])] \
        if "alpha_terms" in dt.attrs else None
    sel: dict[str, list[str]] = {}
    for dim, want, what in (("term", list(terms), "the fit's terms"),
                            ("alpha_term", alpha, "the fit's alpha terms"),
                            ("coef", None if alpha is None else list(terms) + alpha,
                             "the fit's coefficients")):
        if want is not None and (got := _coord(post, dim, want, what)) is not None:
            sel[dim] = got
    if "constant_data" in dt.children and "config" in dt["constant_data"].dims:
        cfg = [str(c) for c in dt["constant_data"].to_dataset()["config"].values]
        if (got := _coord(post, "config", cfg, "the fit's configurations")) is not None:
            sel["config"] = got
    post = post.sel(sel) if sel else post
    fixed = {}
    for name, var in post.data_vars.items():
        want = _CHECKED_VARS.get(str(name))
        if want is not None:
            var = _ordered(var, want, f"posterior variable {name}")
            bad = int(np.count_nonzero(np.isnan(np.asarray(var.values, dtype=float))))
            if bad:
                raise BayesLatencyError(f"posterior variable {name} has {bad:,} of "
                                        f"{var.size:,} draws NaN")
        elif {"chain", "draw"} <= set(var.dims):
            var = var.transpose("chain", "draw", ...)
        fixed[name] = var
    out = dt.copy()
    out["posterior"] = xr.DataTree(post.assign(fixed))
    return out


def newer_model_version(version: Any) -> bool:
    """Whether a file's ``model_version`` is a later one than this package's."""
    try:
        return int(str(version)) > int(MODEL_VERSION)
    except ValueError:
        return False


def read_result(path: str | Path) -> SavedFit:
    """Read a result file; refuses a file made by another model version and one whose
    embedded priors do not hash like its recorded priors hash (altered)."""
    from bayes_latency.textfiles import refuse_special

    path = Path(path)
    refuse_special(path, "posterior file", BayesLatencyError,
                   folders_ok=path.suffix == ".zarr")
    if not path.exists():
        raise BayesLatencyError(f"posterior file {path} does not exist")
    try:
        dt = xr.open_datatree(path, engine="zarr" if path.suffix == ".zarr" else "h5netcdf").load()
    except Exception as e:  # noqa: BLE001 - any reader failure is a bad file for the user
        raise BayesLatencyError(f"cannot read posterior file {path} (truncated, or not a netCDF "
                                f"file written by `bayes-latency fit` or `calibrate`?): "
                                f"{e}") from e
    a = dt.attrs
    if "population_format" in a:
        raise BayesLatencyError(
            f"{path} is a population file (`bayes-latency population` writes these), not a "
            f"fitted posterior: it is the prior of a new configuration for `calibrate "
            f"--population` or `fit --population`, and the source of a zero-shot `export "
            f"--population`; give a file written by `bayes-latency fit` or `calibrate` here")
    if "model_version" not in a or "terms" not in a or "posterior" not in dt.children:
        raise BayesLatencyError(
            f"{path} is not a bayes_latency posterior (no model_version / terms attributes "
            f"or no posterior group); give a file written by `bayes-latency fit` or "
            f"`calibrate`")
    if a.get("model_version") != MODEL_VERSION:
        raise ModelMismatchError(
            f"{path} was made by model version {a.get('model_version')!r}; this bayes_latency "
            f"({__version__}) uses model version {MODEL_VERSION!r}. "
            + ("Upgrade bayes-latency to read it, or refit with this version."
               if newer_model_version(a.get("model_version")) else "Refit with this version."))
    terms = tuple(json.loads(a["terms"]))
    try:
        dt = checked_posterior(dt, terms)
    except BayesLatencyError as exc:
        raise BayesLatencyError(f"posterior file {path}: {exc}; the file is damaged, refit "
                                f"(or restore the file `bayes-latency fit` wrote)") from None
    embedded = None
    if "priors_yaml" in a:
        from bayes_latency.priors import load_priors
        from bayes_latency.textfiles import load_yaml

        embedded = load_priors(load_yaml(a["priors_yaml"]))
        if embedded.hash != a.get("priors_hash"):
            raise ModelMismatchError(
                f"{path}: the embedded priors hash to {embedded.hash}, not to the recorded "
                f"{a.get('priors_hash')}: the file was altered")
    return SavedFit(result=dt, terms=terms, method=a["method"], sampler=a["sampler"],
                    variant=a["variant"], embedded_priors=embedded,
                    noise_load=str(a.get("noise_load", "none")))


def check_priors(path: str | Path, result: xr.DataTree, priors: Any) -> None:
    """Refuse ``priors`` that do not hash like the priors ``result`` was fitted with."""
    recorded = result.attrs.get("priors_hash")
    if recorded != priors.hash:
        raise ModelMismatchError(
            f"{Path(path)} was fitted with priors {recorded}, but the priors given now hash "
            f"to {priors.hash}; load without priors= (the file embeds its own) or pass the "
            "priors file used for the fit (--priors).")


def configs_table(result: xr.DataTree) -> pd.DataFrame:
    """The fitted configurations (index ``config_id``; columns model (the file's
    ``config_llm``), GPU, TP degree and, when the file has it, stack) from ``constant_data``."""
    const = result["constant_data"].to_dataset()
    configs = pd.DataFrame({"model": const["config_llm"].values.astype(str),
                            "gpu": const["config_gpu"].values.astype(str),
                            "tp": const["config_tp"].values.astype(int)},
                           index=pd.Index(const["config"].values.astype(str), name="config_id"))
    if "config_stack" in const:  # Design fills in vLLM otherwise
        configs["stack"] = const["config_stack"].values.astype(str)
    return configs


def restored_attrs(result: xr.DataTree) -> dict[str, Any]:
    """What the attrs of ``result`` give back to a loaded fit: ``data_hash``, ``timings``,
    ``settings`` (the sampler settings) and ``identifiability`` (a report, or None)."""
    a = result.attrs
    ident = None
    if "identifiability" in a:  # hints after loading name the confounded groups too
        ident = IdentifiabilityReport.from_dict(json.loads(a["identifiability"]))
    return {"data_hash": a.get("data_hash"), "timings": json.loads(a.get("timings", "{}")),
            "settings": json.loads(a.get("sampler_settings", "{}")), "identifiability": ident}


def checked_rows(observations: pd.DataFrame, coefs: tuple[str, ...] | list[str],
                 data_hash: str | None) -> pd.DataFrame:
    """The fit rows of ``observations`` (:func:`table_rows`), checked against a fit's data hash:
    what gives a loaded fit its rows back (:meth:`LatencyModel.attach_rows
    <bayes_latency.model.estimator.LatencyModel.attach_rows>`).

    Raises
    ------
    ModelMismatchError
        ``observations`` do not give the fit's rows (their hash differs from ``data_hash``).
    """
    rows, _ = physical_rows(observations, table_rows(observations, coefs))
    h = rows_hash(rows, coefs)
    if data_hash and h != data_hash:
        raise ModelMismatchError(f"these {len(observations)} observations are not the rows the fit "
                                 f"was made on (data hash {h} != {data_hash})")
    return rows
