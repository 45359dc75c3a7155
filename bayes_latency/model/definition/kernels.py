"""Kernel evidence in the hierarchy: measured GEMM efficiency as data on the GPU effects.

With :class:`~bayes_latency.data.kernel_evidence.KernelEvidence` (a fit's ``kernels=``), two parts
join the population level of :func:`~bayes_latency.model.definition.hierarchy.build_model`:

1. **The kernels measure the GPU effect of their own stack.** For each GPU both the fit and the
   tables have, and each measured term ``t`` (``weight_loading``, ``decode_kv``,
   ``prefill_compute``)::

       log_time[g, t] ~ N(kernel_offset[t] + eff_gpu[g, t], kernel_sigma^2)
       kernel_offset[t] ~ N(0, KERNEL_OFFSET_SD^2)

   ``log_time`` is ``-log`` of the share of the datasheet the GPU's GEMMs reach in the term's
   regime; ``kernel_offset`` what a step adds to its GEMMs' time on every GPU alike;
   ``kernel_sigma`` (fixed, ``hierarchy.kernel`` of the prior file) how far a step-level contrast
   may sit from the kernels'. ``eff_gpu`` is the effect of the GPU in the tables' stack (vLLM).

2. **Other stacks depart from it.** A configuration of another stack (Splitwise's harness) adds a
   GPU x stack interaction on the measured terms::

       eff_gpu_stack[g, k] = sigma_gpu_stack[k] * z_gpu_stack[k, g]     (zero-sum over GPUs)

   at a fixed scale (``hierarchy.gpu_stack`` on the measured terms, 0 elsewhere): two GPUs of one
   other stack give one contrast per term, from which no scale is learned, and on a term the
   kernels do not measure nothing separates the interaction from the GPU effect. Without it the
   A100's effect learned from Splitwise's benchmarks (A100/H100 decode 1.50x) would be vLLM's
   too, whose kernels measure 1.87x.

A GPU the fit did not see but the tables hold is drawn in
:func:`~bayes_latency.model.posterior.unseen.config_log_location` from its effect's population
conditioned on its kernels (the same measurement equation, per posterior draw).

The tables' numbers enter as fixed quantities (``kernel_log_time (kernel_gpu, kernel_term)``,
``kernel_sigma``, ``kernel_stack (stack)``, ``sigma_gpu_stack (coef)``) in ``constant_data``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from bayes_latency.model.definition.design import Design, PriorArrays, level_dim
from bayes_latency.model.definition.population import _effect_deterministic, _fixed, _shared

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.data.kernel_evidence import KernelEvidence

__all__ = ["KERNEL_OFFSET_SD", "kernel_effects"]

#: Prior sd of ``kernel_offset`` (log scale): a step's roofline coefficient is 0.1-10x its
#: kernels' datasheet multiple; the data (every GPU of the fit) fix it.
KERNEL_OFFSET_SD = 2.0


def kernel_effects(kernels: KernelEvidence, design: Design, pa: PriorArrays,
                   rep: np.ndarray | None = None) -> pt.TensorVariable | float:
    """Add the kernel evidence to the model in context; return the GPU x stack interaction of
    each configuration, ``(config, coef)`` (0.0 when every configuration is of the tables' stack
    or the fit has one GPU).

    Must run after the crossed effects (it reads ``eff_gpu``). ``rep``: each coefficient's
    sum-only group representative (the interaction is shared like the other effects).
    """
    model = pm.modelcontext(None)
    ev = kernels.restricted(tuple(design.coefs))
    if ev is None:
        return 0.0
    keep = pa.factor_keep("gpu")
    model.add_coords({"kernel_gpu": list(ev.gpus), "kernel_term": list(ev.terms)})
    y = _fixed("kernel_log_time", np.asarray(ev.log_time, dtype=float),
               dims=("kernel_gpu", "kernel_term"))
    s = float(pa.kernel_sigma)
    _fixed("kernel_sigma", s)
    _fixed("kernel_stack", np.asarray([float(st == ev.stack) for st in design.stacks]),
           dims=level_dim("stack"))
    # 1. the measurement of the tables' stack's GPU effects
    both = [(i, j) for i, g in enumerate(design.gpus) if (j := ev.index_of(g)) is not None]
    terms = [t for t in ev.terms if keep[design.coefs.index(t)] == 1.0]
    if both and terms:
        eff = model["eff_gpu"]
        di, gi = (np.asarray(v) for v in zip(*both, strict=True))
        ti = np.asarray([list(ev.terms).index(t) for t in terms])
        ki = np.asarray([design.coefs.index(t) for t in terms])
        off = pm.Normal("kernel_offset", 0.0, KERNEL_OFFSET_SD, dims="kernel_term")
        pred = off[ti][None, :] + pt.as_tensor(eff)[di][:, ki]
        r = (y[gi][:, ti] - pred) / s
        pm.Potential("loglik_kernels", -0.5 * pt.sum(r * r)
                     - r.size * (np.log(s) + 0.5 * np.log(2.0 * np.pi)))
    # 2. the departure of the other stacks
    other = (design.configs["stack"] != ev.stack).to_numpy()
    if not other.any() or len(design.gpus) <= 1:
        return 0.0
    # only on the terms the kernels measure: elsewhere nothing tells vLLM's contrast from the
    # other stack's, and an interaction there would be a prior-only direction
    measured = keep * np.asarray([c in ev.terms for c in design.coefs], dtype=float)
    scale = np.where(measured == 1.0, float(pa.sigma_gpu_stack), 0.0)
    _fixed("sigma_gpu_stack", scale, dims="coef")
    z = _shared(pm.ZeroSumNormal("z_gpu_stack", dims=("coef", level_dim("gpu"))), rep)
    inter = (scale[:, None] * z).T * measured[None, :]
    _effect_deterministic("gpu_stack", inter, "gpu", measured)
    return inter[design.index("gpu")] * other[:, None].astype(float)
