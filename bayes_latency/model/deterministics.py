"""Variables derived after sampling: the model's deterministics and the configuration draws.

nutpie's trace holds only the free variables (its expand function would cost Numba compilation);
:func:`_with_deterministics` computes every deterministic of the PyMC model for all draws at
once. On the fast path (``method="laplace-hierarchy"``) the configuration coefficients are
integrated out of the likelihood; :func:`add_config_draws` draws them afterwards, per posterior
draw, as the ``beta`` and ``alpha`` variables of the posterior.

Importing this module is light (no PyMC or PyTensor).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.estimator import LatencyModel


def _with_deterministics(model: pm.Model, post: xr.Dataset) -> xr.Dataset:
    """``post`` (draws of the free variables) with every deterministic of ``model`` added.

    Computed for all draws at once by one vectorised PyTensor function in ``FAST_COMPILE`` mode
    (NumPy, nothing to compile), instead of by nutpie's per-draw expand function, whose Numba
    compilation cost ~18 CPU s on empty caches (demo fit, issue 15: 55 against 73 CPU s of
    compilation); the values agree to 4e-15 relative. The ``OpFromGraph`` nodes of the graph
    (``LogSumExp``) are inlined and its ``ViewOp`` nodes dropped first (:func:`_inlined`):
    vectorised, they were ``Blockwise`` nodes calling their inner function once per draw, with
    C thunks PyTensor built with gcc on empty caches (10 modules, ~9 s of wall time of a
    machine's first demo fit).
    """
    import pytensor
    import pytensor.tensor as pt
    from pytensor.graph.replace import vectorize_graph

    rvs = list(model.free_RVs)
    dets = list(model.deterministics)
    if not dets:
        return post
    batched = {rv: pt.tensor(dtype=rv.dtype, shape=(None, *rv.type.shape), name=rv.name)
               for rv in rvs}
    plain = {rv: rv.type(name=rv.name) for rv in rvs}
    outs = vectorize_graph(_inlined(dets, plain), replace=dict(zip(plain.values(),
                                                                  batched.values(), strict=True)))
    # no rewrite may fold the inlined graphs back into OpFromGraph nodes (LogSumExp)
    mode = pytensor.compile.mode.get_mode("FAST_COMPILE").excluding("symbolic_op_recognition")
    fn = pytensor.function(list(batched.values()), outs, mode=mode, on_unused_input="ignore")
    C, D = post.sizes["chain"], post.sizes["draw"]
    args = []
    for rv in rvs:
        a = post[rv.name].transpose("chain", "draw", ...).values
        args.append(a.reshape(C * D, *a.shape[2:]))
    new = {}
    for det, out, val in zip(dets, outs, fn(*args), strict=True):
        val = np.asarray(val)
        if out.type.ndim == det.type.ndim:  # does not depend on the draws (a constant)
            val = np.broadcast_to(val, (C * D, *val.shape))
        dims = model.named_vars_to_dims.get(det.name) or [f"{det.name}_dim_{j}"
                                                          for j in range(val.ndim - 1)]
        new[det.name] = (("chain", "draw", *dims), val.reshape(C, D, *val.shape[1:]))
    used = {d for dims, _ in new.values() for d in dims}
    coords = {d: list(v) for d, v in model.coords.items()
              if d in used and d not in post.coords and v is not None}
    return post.assign(new).assign_coords(coords)


def _inlined(outs: list, replace: dict) -> list:
    """``outs`` with ``replace`` applied, every ``OpFromGraph`` node replaced by its inner graph
    and every ``ViewOp`` by its input (a copy: the model's graph is left alone)."""
    from pytensor.compile.builders import OpFromGraph
    from pytensor.compile.ops import ViewOp
    from pytensor.compile.rewriting import inline_ofg_node
    from pytensor.graph.fg import FunctionGraph
    from pytensor.graph.replace import clone_replace
    from pytensor.graph.rewriting.basic import dfs_rewriter, node_rewriter

    @node_rewriter([OpFromGraph, ViewOp])
    def inline(fgraph: FunctionGraph, node: object) -> list | None:
        if isinstance(node.op, ViewOp):
            return [node.inputs[0]]
        return inline_ofg_node(node)

    fg = FunctionGraph(outputs=clone_replace(outs, replace=replace), clone=False)
    dfs_rewriter(inline).rewrite(fg)
    return list(fg.outputs)


def add_config_draws(est: LatencyModel, dt: xr.DataTree, seed: int) -> None:
    """Fast path: draw the integrated-out configuration coefficients, per posterior draw."""
    from bayes_latency.model.hierarchy import config_draws, prior_arrays

    post = dt["posterior"].to_dataset() if isinstance(dt, xr.DataTree) else dt["posterior"]
    if "beta" in post or "theta_pop" not in post:
        return
    t0 = time.perf_counter()
    tp = post["theta_pop"].transpose("chain", "draw", "config", "coef").values
    sc = post["sigma_config"].transpose("chain", "draw", "coef").values
    Cn, Dn = tp.shape[:2]
    pa = prior_arrays(est.priors, est.coefs, est.design.gpus)
    theta, n_neg = config_draws(tp.reshape(Cn * Dn, *tp.shape[2:]), sc.reshape(Cn * Dn, -1),
                                est.summaries, est.design, np.random.default_rng(seed + 7),
                                scale=np.exp(pa.mu_mean))
    theta = theta.reshape(tp.shape)
    if n_neg:
        est.report.notes.append(f"{n_neg} of {Cn * Dn * len(est.design.configs)} (draw, "
                                 "configuration) coefficient vectors drawn from the truncated "
                                 "(theta >= 0) conditional")
    nb = len(est.terms)
    post = post.assign(
        beta=(("chain", "draw", "config", "term"), theta[..., :nb]),
        alpha=(("chain", "draw", "config", "alpha_term"), theta[..., nb:]),
    ).assign_coords(term=list(est.terms), alpha_term=list(est.alpha_terms))
    dt["posterior"] = xr.DataTree(post)
    est.timings["config_draws_s"] = time.perf_counter() - t0
