"""The Laplace sampler: draws of the Gaussian at the mode, the same from a seed in every process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CONFIGS = [("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1), ("mixtral-8x7b", "H100", 2)]
SCRIPT = f"""
import sys, warnings
sys.path.insert(0, {str(HERE)!r})
warnings.filterwarnings("ignore")
import numpy as np
from obs_factory import make_observations
from bayes_latency.model.estimator import LatencyModel
obs, _ = make_observations({CONFIGS!r}, n_iter=60, n_win=40, n_alpha=20, seed=2)
m = LatencyModel(sampler="laplace").fit(obs, draws=100, chains=2, seed=3, prior_draws=0,
                                        progress=False)
post = m.result["posterior"]
for v in ("mu", "z_pop", "beta"):
    x = post[v].values
    print(v, repr(float(x.mean())), repr(float(x.std(axis=(0, 1)).mean())))
"""


def _fit_in_a_process() -> dict[str, tuple[float, float]]:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return {ln.split()[0]: (float(ln.split()[1]), float(ln.split()[2]))
            for ln in out.splitlines() if ln.split() and ln.split()[0] in ("mu", "z_pop", "beta")}


def test_laplace_draws_scatter_and_repeat_from_their_seed_across_processes():
    a, b = _fit_in_a_process(), _fit_in_a_process()
    for v in ("mu", "z_pop", "beta"):
        # a Gaussian around the mode: the draws of every variable scatter
        assert a[v][1] > 1e-3, (v, a[v])
        # the same seed, another process: the same draws (to rounding)
        np.testing.assert_allclose(a[v], b[v], rtol=1e-9, atol=1e-12, err_msg=v)
