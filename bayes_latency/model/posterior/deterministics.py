"""Variables derived after sampling: the model's deterministics and the configuration draws.

nutpie's trace holds only the unconstrained draws (its expand function would cost Numba
compilation); :func:`_with_deterministics` computes the free variables and every deterministic of
the PyMC model from them for all draws at once. On the fast path
(``method="laplace-hierarchy"``) the configuration coefficients are integrated out of the
likelihood; :func:`add_config_draws` draws them afterwards, per posterior
draw, as the ``beta`` and ``alpha`` variables of the posterior.

Importing this module is light (no PyMC or PyTensor).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from bayes_latency.model.definition.design import filled

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.posterior.state import FitState


def _with_deterministics(model: pm.Model, post: xr.Dataset, names: Sequence[str] | None = None,
                         cache: dict | None = None) -> xr.Dataset:
    """``post`` with every free variable and deterministic of ``model``, as a PyMC trace has them.

    ``post`` holds either the draws of the free variables (then the deterministics are added) or
    those of the model's value variables, as nutpie's trace does (:func:`~bayes_latency.model.
    compiled.compiled_model`: ``sigma_log__`` for ``sigma``; then the transformed free variables
    are computed from them too and the value variables dropped). ``names``: compute only these
    (the convergence checks of an extended fit need a few); ``cache``, a dict the caller keeps,
    holds the compiled function for later calls on posteriors of the same variables.

    Computed for all draws at once by one vectorised PyTensor function in ``FAST_COMPILE`` mode
    (NumPy, nothing to compile), instead of by nutpie's per-draw expand function, whose Numba
    compilation cost (demo fit, empty caches) ~18 CPU s with the deterministics in it
    (55 against 73 CPU s of compilation) and ~6 more with the free variables (44.6 against 52.4
    CPU s; 10.4 against 12.1 on warm caches); values agree with Numba's to a few ulp (the
    unconstrained draws are the same bits). The ``OpFromGraph`` nodes of the graph
    (``LogSumExp``) are inlined and its ``ViewOp`` nodes dropped first (:func:`_inlined`):
    vectorised, they were ``Blockwise`` nodes calling their inner function once per draw, with
    C thunks PyTensor built with gcc on empty caches (10 modules, ~9 s of wall time of a
    machine's first demo fit).
    """
    import pytensor
    import pytensor.tensor as pt
    from pytensor.graph.replace import vectorize_graph

    rvs = list(model.free_RVs)
    values = [model.rvs_to_values[rv] for rv in rvs]
    if cache is not None and "fn" in cache:
        inputs, targets, outs, fn = cache["inputs"], cache["targets"], cache["outs"], cache["fn"]
    else:
        if all(rv.name in post for rv in rvs):  # draws of the free variables
            inputs, targets = rvs, list(model.deterministics)
        else:  # nutpie's draws of the value variables
            missing = [v.name for v in values if v.name not in post]
            if missing:
                raise KeyError(f"posterior lacks the draws of {missing}")
            inputs = values
            targets = [rv for rv, v in zip(rvs, values, strict=True) if v.name != rv.name]
            targets += list(model.deterministics)
        if names is not None:
            targets = [t for t in targets if t.name in names]
        if not targets:
            return post
        graphs = targets if inputs is rvs else model.replace_rvs_by_values(targets)
        batched = {x: pt.tensor(dtype=x.dtype, shape=(None, *x.type.shape), name=x.name)
                   for x in inputs}
        plain = {x: x.type(name=x.name) for x in inputs}
        outs = vectorize_graph(_inlined(graphs, plain),
                               replace=dict(zip(plain.values(), batched.values(), strict=True)))
        # no rewrite may fold the inlined graphs back into OpFromGraph nodes (LogSumExp)
        mode = pytensor.compile.mode.get_mode("FAST_COMPILE").excluding("symbolic_op_recognition")
        fn = pytensor.function(list(batched.values()), outs, mode=mode, on_unused_input="ignore")
        if cache is not None:
            cache.update(inputs=inputs, targets=targets, outs=outs, fn=fn)
    C, D = post.sizes["chain"], post.sizes["draw"]
    args = []
    for x in inputs:
        a = post[x.name].transpose("chain", "draw", ...).values
        args.append(a.reshape(C * D, *a.shape[2:]))
    new = {}
    for var, out, val in zip(targets, outs, fn(*args), strict=True):
        val = np.asarray(val)
        if out.type.ndim == var.type.ndim:  # does not depend on the draws (a constant)
            val = np.broadcast_to(val, (C * D, *val.shape))
        dims = model.named_vars_to_dims.get(var.name) or [f"{var.name}_dim_{j}"
                                                          for j in range(val.ndim - 1)]
        new[var.name] = (("chain", "draw", *dims), val.reshape(C, D, *val.shape[1:]))
    free = {rv.name for rv in rvs}
    if inputs is not rvs:  # the value variables give way to the free variables, in model order
        kept = {k: (post[k].dims, post[k].values) for k in free if k in post}
        order = [k for k in [rv.name for rv in rvs] + [d.name for d in model.deterministics]
                 if k in kept or k in new]
        ds = xr.Dataset({k: ({**kept, **new})[k] for k in order},
                        coords={k: post.coords[k] for k in ("chain", "draw")}, attrs=post.attrs)
        used = {d for k in order for d in ds[k].dims}
        coords = {d: list(v) for d, v in model.coords.items() if d in used and v is not None}
        return ds.assign_coords(coords)
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


def config_draws_posterior(state: FitState, post: xr.Dataset, seed: int) -> tuple[xr.Dataset, int]:
    """``post`` with the fast path's configuration coefficients drawn (``beta (config, term)``,
    ``alpha (config, alpha_term)``: two variables on their own axes, not one on ``coef``, because
    BLIS takes the iteration coefficients and the request overheads apart), per posterior draw, and how many (draw, configuration) vectors came from the truncated
    conditional; ``post`` unchanged when it has them already or is not the fast path's."""
    from bayes_latency.model.definition.hierarchy import config_draws, prior_arrays

    if "beta" in post or "theta_pop" not in post:
        return post, 0
    tp = post["theta_pop"].transpose("chain", "draw", "config", "coef").values
    pa = prior_arrays(state.priors, state.coefs, state.design.gpus)
    # NaN where it is fixed at the prior median
    sc = filled(post["sigma_config"], float(pa.sigma_config["median"]))
    sc = sc.transpose("chain", "draw", "coef").values
    Cn, Dn = tp.shape[:2]
    theta, n_neg = config_draws(tp.reshape(Cn * Dn, *tp.shape[2:]), sc.reshape(Cn * Dn, -1),
                                state.summaries, state.design, np.random.default_rng(seed + 7),
                                scale=np.exp(pa.mu_mean))
    theta = theta.reshape(tp.shape)
    nb = len(state.terms)
    post = post.assign(
        beta=(("chain", "draw", "config", "term"), theta[..., :nb]),
        alpha=(("chain", "draw", "config", "alpha_term"), theta[..., nb:]),
    ).assign_coords(term=list(state.terms), alpha_term=list(state.alpha_terms))
    return post, n_neg


def add_config_draws(state: FitState, dt: xr.DataTree, seed: int) -> tuple[float | None, list[str]]:
    """Fast path: draw the integrated-out configuration coefficients, per posterior draw, into
    ``dt["posterior"]`` (in place). Returns the seconds it took (None when there was nothing to
    draw) and the notes for the fit report."""
    post = dt["posterior"].to_dataset() if isinstance(dt, xr.DataTree) else dt["posterior"]
    if "beta" in post or "theta_pop" not in post:
        return None, []
    t0 = time.perf_counter()
    post, n_neg = config_draws_posterior(state, post, seed)
    notes = []
    if n_neg:
        Cn, Dn = post.sizes["chain"], post.sizes["draw"]
        notes.append(f"{n_neg} of {Cn * Dn * len(state.design.configs)} (draw, "
                     "configuration) coefficient vectors drawn from the truncated "
                     "(theta >= 0) conditional")
    dt["posterior"] = xr.DataTree(post)
    return time.perf_counter() - t0, notes
