"""Configurations of a result file by LLM, GPU, TP degree and serving stack.

>>> from bayes_latency import select                                    # doctest: +SKIP
>>> dt = xr.open_datatree("posterior.nc", engine="h5netcdf")            # doctest: +SKIP
>>> dt["posterior"]["beta"].sel(config=select(dt, llm="llama-2-70b", gpu="H100", tp=4))

The file's configuration table is ``constant_data`` (``config_llm``, ``config_gpu``,
``config_tp``, ``config_stack`` on ``config``); the draw groups index configurations by their id
on ``config`` only. ``llm``, ``gpu``, ``tp`` and ``stack`` are the level dimensions of the factor
effects (``eff_model (llm, coef)``), so ``post.sel(llm=...)`` does not select configurations.

Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

from types import SimpleNamespace

import xarray as xr

from bayes_latency.model.posterior.persistence import configs_table
from bayes_latency.model.posterior.predict import config_ids


def select(dt: xr.DataTree, llm: str | None = None, gpu: str | None = None,
           tp: int | None = None, stack: str | None = None) -> list[str]:
    """The ``config`` ids of the result ``dt`` (a fit's result or a file opened with
    ``xr.open_datatree``) matching the given levels; ``None`` matches every level.

    Names resolve like :meth:`LatencyModel.coefficients
    <bayes_latency.model.estimator.LatencyModel.coefficients>` does: a GPU alias (``"H100"``
    for ``"H100-SXM"``, :mod:`bayes_latency.physics.hardware`) or a Hugging Face model name
    (:mod:`bayes_latency.physics.models`) matches the canonical level the fit stored. An empty
    list when no fitted configuration matches.
    """
    return config_ids(SimpleNamespace(configs=configs_table(dt)), llm, gpu, tp, stack)
