"""Population files: reading one back (:func:`load_population`), a command's ``--population``
(:func:`resolve_population`) and the population the package ships (:data:`SHIPPED_POPULATION`).

A file is written by :meth:`~bayes_latency.model.posterior.fleet.Population.save`; reading it
refuses another model version, another file format, altered embedded priors or terms that do
not match, and damaged draws (:func:`~bayes_latency.model.posterior.population_draws.checked_draws`).
Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import xarray as xr

from bayes_latency import MODEL_VERSION, __version__
from bayes_latency.errors import BayesLatencyError, ModelMismatchError
from bayes_latency.model.posterior.fleet import POPULATION_FORMAT, Population
from bayes_latency.model.posterior.population_draws import checked_draws

__all__ = ["SHIPPED_POPULATION", "load_population", "resolve_population"]

#: The population the package ships: the real H100 fleet (see
#: :meth:`~bayes_latency.model.posterior.fleet.Population.describe`).
SHIPPED_POPULATION = Path(__file__).resolve().parents[1] / "data" / "population_h100.nc"


def load_population(path: str | Path, terms: tuple[str, ...] | None = None) -> Population:
    """Read a population file, checking its format, model version, embedded priors and, when
    ``terms`` are given, that they are the population's.

    The draws are read by dimension name and checked (:func:`checked_draws`).

    Raises
    ------
    BayesLatencyError
        Missing or unreadable file, not a population file, or damaged draws (naming the file
        and the variable).
    ModelMismatchError
        Another model version or population format, altered priors, or other terms.
    """
    from bayes_latency.priors import load_priors
    from bayes_latency.textfiles import load_yaml, refuse_special

    path = Path(path)
    refuse_special(path, "population file", BayesLatencyError, folders_ok=False)
    if not path.is_file():
        raise BayesLatencyError(f"population file {path} does not exist")
    try:
        ds = xr.open_dataset(path, engine="h5netcdf").load()
    except Exception as e:  # noqa: BLE001 - any reader failure is a bad file for the user
        raise BayesLatencyError(f"cannot read population file {path} (truncated, or not a "
                                f"netCDF file written by `bayes-latency population`?): {e}") from e
    a = dict(ds.attrs)
    if "population_format" not in a or "mu" not in ds:
        raise BayesLatencyError(f"{path} is not a population file (no population_format "
                                "attribute or no mu); write one with `bayes-latency population`")
    if str(a["population_format"]) != POPULATION_FORMAT:
        raise ModelMismatchError(f"{path}: population format {a['population_format']!r}, this "
                                 f"bayes_latency reads format {POPULATION_FORMAT!r}; rebuild it")
    if str(a.get("model_version")) != MODEL_VERSION:
        from bayes_latency.model.posterior.persistence import newer_model_version

        raise ModelMismatchError(
            f"{path} was made by model version {a.get('model_version')!r}; this bayes_latency "
            f"({__version__}) uses model version {MODEL_VERSION!r}. "
            + ("Upgrade bayes-latency to read it, or rebuild" if newer_model_version(
                a.get("model_version")) else "Rebuild")
            + " the population (`bayes-latency population TABLES --out P`).")
    priors = load_priors(load_yaml(a["priors_yaml"]))
    if priors.hash != a.get("priors_hash"):
        raise ModelMismatchError(f"{path}: the embedded priors hash to {priors.hash}, not to the "
                                 f"recorded {a.get('priors_hash')}: the file was altered")
    pop_terms = tuple(json.loads(a["terms"]))
    if terms is not None and tuple(terms) != pop_terms:
        raise ModelMismatchError(f"{path}: the population has terms {list(pop_terms)}, the fit "
                                 f"asks for {list(terms)}; fit with --terms "
                                 f"{','.join(pop_terms)} or rebuild the population")
    configs = pd.DataFrame({"model": ds["config_llm"].values.astype(str),
                            "gpu": ds["config_gpu"].values.astype(str),
                            "tp": ds["config_tp"].values.astype(int),
                            "stack": ds["config_stack"].values.astype(str)},
                           index=pd.Index(ds["config"].values.astype(str), name="config_id"))
    draws = ds.drop_vars(["config_llm", "config_gpu", "config_tp", "config_stack", "config"])
    draws.attrs = {}
    alpha_terms = tuple(json.loads(a["alpha_terms"]))
    try:
        draws = checked_draws(draws, pop_terms + alpha_terms, configs)
    except BayesLatencyError as exc:
        raise BayesLatencyError(f"population file {path}: {exc}; rebuild it with `bayes-latency "
                                f"population`") from None
    attrs = {k: v for k, v in a.items()
             if k not in ("priors_yaml", "priors_hash", "terms", "alpha_terms",
                          "population_format")}
    attrs["priors_hash"] = priors.hash
    return Population(draws=draws, configs=configs, terms=pop_terms,
                      alpha_terms=alpha_terms, priors=priors, attrs=attrs)


def resolve_population(spec: str | Path | None, terms: tuple[str, ...] | None = None
                       ) -> Population | None:
    """The population a command's ``--population`` names: a file, ``none`` (None: the
    roofline priors alone) or, for None, the shipped population :data:`SHIPPED_POPULATION`."""
    if spec is not None and str(spec).lower() == "none":
        return None
    return load_population(SHIPPED_POPULATION if spec is None else spec, terms)
