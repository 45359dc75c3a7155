"""Reading a fit's result DataTree for the checks: its groups, sample dims and LOO input.

:data:`SAMPLE_DIMS` and :data:`CELL_VARIABLES` name the sample dimensions and the per-cell
variables; :func:`is_approximate` reads the ``approximate`` flag; :func:`log_likelihood_tree`
builds the small ``posterior`` + ``log_likelihood`` tree ArviZ's LOO needs; the private helpers
fetch a non-empty group, keep the numeric posterior variables and label an element.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

SAMPLE_DIMS = ("chain", "draw")
CELL_VARIABLES = ("beta", "alpha")
"""Posterior variables whose R-hat / ESS are also reported per (config, term) cell."""


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
