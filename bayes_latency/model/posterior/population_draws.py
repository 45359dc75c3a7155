"""A population's joint draws read by dimension name and checked (shapes, levels, values).

:func:`checked_draws` is what :meth:`~bayes_latency.model.posterior.fleet.Population.save`
checks before it writes and what
:func:`~bayes_latency.model.posterior.population_file.load_population` checks after it reads.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.errors import BayesLatencyError
from bayes_latency.model.definition.design import level_dim

__all__ = ["FACTORS", "checked_draws"]

#: The factors of the hierarchy whose effects a population keeps (``eff_<factor>``).
FACTORS = ("model", "gpu", "tp", "stack")


def _draw_dims(name: str) -> tuple[str, ...] | None:
    """The dimensions of a population variable in the order the readers take them (None for a
    variable the readers do not use)."""
    if name.startswith("eff_") and name[4:] in FACTORS:
        return (level_dim(name[4:]), "coef", "sample")
    if name.startswith("sigma_") and name.endswith("_common"):
        return ("sample",)
    if name == "mu" or name.startswith("sigma_"):
        return ("coef", "sample")
    return None


def checked_draws(draws: xr.Dataset, coefs: tuple[str, ...],
                  configs: pd.DataFrame | None = None) -> xr.Dataset:
    """A population's draws read by dimension name: its coefficients in the order ``coefs``,
    each variable transposed to the order the readers take (``eff_<factor> (<level>, coef,
    sample)``, ``mu`` and ``sigma_<factor> (coef, sample)``, ``sigma_<factor>_common
    (sample)``), after checking shapes and values.

    Parameters
    ----------
    draws
        The draws (a file's variables, or :attr:`Population.draws`).
    coefs
        The population's beta terms then alpha terms.
    configs
        The fitted configurations (``model``, ``gpu``, ``tp``, ``stack``): each level must be
        one of its factor's ``eff_<factor>`` levels.

    Raises
    ------
    BayesLatencyError
        Naming the variable: no ``coef`` or ``sample`` dimension, other coefficients than
        ``coefs``, a variable of other dimensions, a configuration level missing from its
        effects, a value that is not finite or a negative scale.
    """
    for dim in ("coef", "sample"):
        if dim not in draws.dims or draws.sizes[dim] < 1:
            raise BayesLatencyError(f"no {dim!r} dimension (or an empty one)")
    from bayes_latency.model.posterior.persistence import _coord, _ordered

    _coord(draws, "coef", list(coefs), "the population's terms and alpha terms",
           owner="the population")
    draws = draws.sel(coef=list(coefs))
    out = {}
    for name, var in draws.data_vars.items():
        want = _draw_dims(str(name))
        if want is None:
            out[name] = var
            continue
        var = _ordered(var, want, f"variable {name}")
        vals = np.asarray(var.values, dtype=float)
        bad = int(np.size(vals) - np.count_nonzero(np.isfinite(vals)))
        if bad:
            raise BayesLatencyError(f"variable {name} has {bad:,} of {vals.size:,} values "
                                    f"not finite (NaN or inf)")
        if str(name).startswith("sigma_") and np.any(vals < 0):
            raise BayesLatencyError(f"variable {name} (a scale) has negative values")
        out[name] = var
    draws = draws.assign(out)
    if configs is not None:
        for factor, col in (("model", "model"), ("gpu", "gpu"), ("tp", "tp"), ("stack", "stack")):
            eff = draws.get(f"eff_{factor}")
            if eff is None or col not in configs:
                continue
            levels = {str(v) for v in eff[level_dim(factor)].values}
            lost = sorted({str(v) for v in configs[col]} - levels)
            if lost:
                raise BayesLatencyError(f"variable eff_{factor} has no level {lost} of the "
                                        f"fitted configurations (dimension "
                                        f"{level_dim(factor)!r} trimmed?)")
    return draws
