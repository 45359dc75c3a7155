"""BLIS exports of the real-data fit for the configurations of the 16 real runs.

The real lifecycle runs (``../shared/data/real/h100-lifecycle``) served four models on H100:
Llama-2-7B at TP 1, Llama-2-70B at TP 4, CodeLlama-34B at TP 2 and Mixtral-8x7B at TP 2. This
module writes one BLIS YAML export per configuration (posterior mean plus posterior draws, see
:func:`bayes_latency.export.document.blis_yaml`) as ``<model>-h100-tp<N>.yaml``, the files the BLIS
end-to-end harness (``bayes-latency study blis``) simulates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bayes_latency.export.document import blis_yaml, provenance
from bayes_latency.io import atomic_write_text

REAL_RUN_CONFIGS: tuple[tuple[str, int], ...] = (
    ("llama-2-7b", 1), ("llama-2-70b", 4), ("codellama-34b", 2), ("mixtral-8x7b", 2))
"""(model, TP) of the 16 real H100 runs, by model."""

REAL_RUN_GPU = "H100"
N_EXPORT_DRAWS = 40
"""Posterior draws written into each export (the harness simulates at least 20 of them)."""


def export_name(model: str, tp: int) -> str:
    """File name of one export: ``<model>-h100-tp<N>.yaml``."""
    return f"{model}-h100-tp{int(tp)}.yaml"


def write_real_exports(model: Any, out_dir: Path, posterior_path: Path | None = None,
                       n_draws: int = N_EXPORT_DRAWS, seed: int = 0) -> list[Path]:
    """Write the BLIS exports of a fitted :class:`~bayes_latency.model.estimator.LatencyModel`.

    Parameters
    ----------
    model
        The fitted estimator (its ``coefficients(model, gpu, tp)`` gives seen and unseen
        configurations alike; unseen ones carry the population's wider spread).
    out_dir
        Folder of the exports (created).
    posterior_path
        The saved posterior, recorded (with its sha256) in each export's provenance.
    n_draws, seed
        Posterior draws per export and the seed of their selection.

    Returns
    -------
    list of Path
        The files written, in :data:`REAL_RUN_CONFIGS` order.
    """
    prov = provenance(model.result.attrs, posterior_path)
    paths = []
    for name, tp in REAL_RUN_CONFIGS:
        config = {"model": name, "gpu": REAL_RUN_GPU, "tp": tp}
        coefs = model.coefficients(name, REAL_RUN_GPU, tp)
        path = Path(out_dir) / export_name(name, tp)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, blis_yaml(coefs, config, prov, n_draws=n_draws, seed=seed))
        paths.append(path)
    return paths


__all__ = ["N_EXPORT_DRAWS", "REAL_RUN_CONFIGS", "REAL_RUN_GPU", "export_name",
           "write_real_exports"]
