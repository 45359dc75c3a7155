"""The noise of a fit per (configuration, noise class): lookup with proxies, per row, from a result.

The noise table maps configuration id to noise class (:func:`~bayes_latency.model.definition.likelihood.noise_kind`) to
:class:`~bayes_latency.model.definition.likelihood.NoiseParams`. :func:`noise_params` looks one up, borrowing a fitted class
for classes that are predicted but not fitted (:data:`NOISE_PROXY`) and the fleet median for
unknown configurations; :func:`row_noise` gives every row of a table its noise; and
:func:`noise_from_result` reads the table back from a fitted result (the ``summaries`` group,
or on the full path the posterior means of ``noise_sigma`` / ``noise_tau`` / ``noise_nu``).

Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.model.definition.likelihood import NoiseParams, noise_kind, noise_load

#: Noise of kinds that are predicted but not fitted, borrowed from a fitted kind of the same config.
NOISE_PROXY = {"request_prefill": ("step_window", "iteration"),
               "request_decode": ("step_window", "iteration"),
               "benchmark_mean": ("iteration",),
               # a noise class without rows in the configuration: its kind's other class
               "iteration_prefill": ("iteration",), "iteration": ("iteration_prefill",),
               "benchmark_mean_prefill": ("benchmark_mean", "iteration_prefill"),
               "workload_decode": ("workload_e2e",)}

NoiseTable = Mapping[str, Mapping[str, NoiseParams]]


def noise_params(noise: NoiseTable, cfg: str, kind: str) -> NoiseParams:
    """Noise parameters of (configuration, kind) in ``noise``; the fleet median for unseen ones."""
    mine = noise.get(cfg, {})
    p = mine.get(kind)
    if p is not None:
        return p
    # kinds that are not fitted (request spans) are sums of steps like step windows
    for proxy in NOISE_PROXY.get(kind, ()):
        if proxy in mine:
            return mine[proxy]
    vals = [n[kind] for n in noise.values() if kind in n]
    if not vals:
        return NoiseParams(sigma=0.1, tau=0.0, nu=5.0)
    return NoiseParams(sigma=float(np.median([v.sigma for v in vals])),
                       tau=float(np.median([v.tau for v in vals])),
                       nu=float(np.median([v.nu for v in vals])),
                       gamma=float(np.median([v.gamma for v in vals])),
                       load_ref=float(np.median([v.load_ref for v in vals])), load=vals[0].load)


def row_noise(noise: NoiseTable, observations: pd.DataFrame
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row noise of each row's (configuration, noise class): the log-scale ``s_i``, the
    Student-t dof and the offset of ``log y`` over ``log mu`` of multi-step rows
    (:mod:`bayes_latency.model.definition.likelihood`), the scale at each row's load (:func:`~bayes_latency.model.definition.likelihood.noise_load` of the
    covariate its noise was fitted with)."""
    scale = np.empty(len(observations))
    nu = np.empty(len(observations))
    off = np.zeros(len(observations))
    n = observations["n_steps"].to_numpy(dtype=float)
    key = [observations["config_id"].to_numpy(), noise_kind(observations)]
    loads: dict[str, np.ndarray] = {}
    for (c, k), idx in pd.Series(0, index=observations.index).groupby(key).indices.items():
        p = noise_params(noise, str(c), str(k))
        if p.load not in loads:
            loads[p.load] = noise_load(observations, p.load)
        ll = loads[p.load][idx]
        scale[idx] = p.scale(n[idx], ll)
        nu[idx] = p.nu
        off[idx] = p.log_offset(n[idx], ll)
    return scale, nu, off


def noise_from_result(result: xr.DataTree, method: str) -> dict[str, dict[str, NoiseParams]]:
    """The noise table of a fitted result: posterior means on the full path (when the posterior
    has ``noise_sigma``), else the stored per-(config, kind) values of its ``summaries`` group."""
    ds = result["summaries"].to_dataset()
    post = result["posterior"].to_dataset()
    load = str(ds.attrs.get("noise_load", "none"))
    out: dict[str, dict[str, NoiseParams]] = {}
    for c in ds["config"].values:
        d = {}
        for k in ds["kind"].values:
            if method == "full" and "noise_sigma" in post:
                sig = float(post["noise_sigma"].sel(config=c, kind=k).mean())
                tau = float(post["noise_tau"].sel(config=c, kind=k).mean())
                nu = float(post["noise_nu"].sel(config=c, kind=k).mean())
                gam = (float(post["noise_gamma"].sel(config=c, kind=k).mean())
                       if "noise_gamma" in post else 0.0)
                d[str(k)] = NoiseParams(sig, tau if k == "step_window" else 0.0, nu, gam,
                                        _stored(ds, "noise_load_ref", c, k), load)
            else:
                s = float(ds["noise_sigma"].sel(config=c, kind=k))
                if np.isfinite(s):
                    d[str(k)] = NoiseParams(s, float(ds["noise_tau"].sel(config=c, kind=k)),
                                            float(ds["noise_nu"].sel(config=c, kind=k)),
                                            _stored(ds, "noise_gamma", c, k),
                                            _stored(ds, "noise_load_ref", c, k), load)
        out[str(c)] = d
    return out


def _stored(ds: xr.Dataset, name: str, c: object, k: object) -> float:
    """A stored per-(config, kind) noise value of the ``summaries`` group, 0 when absent."""
    if name not in ds:
        return 0.0
    v = float(ds[name].sel(config=c, kind=k))
    return v if np.isfinite(v) else 0.0
