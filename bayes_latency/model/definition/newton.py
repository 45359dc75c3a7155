"""A bound-constrained minimiser: projected Newton (Bertsekas 1982) with an Armijo arc search.

Stage 1 (:mod:`bayes_latency.model.definition.summaries`) minimises each configuration's negative
log-likelihood in the coefficients (``u >= 0``) and log noise (bounded) with
:func:`_projected_newton`; :func:`_newton_direction` is its Newton step with the Hessian made
positive definite. Generic: any ``fun(x, order) -> (f, g, H)`` over a box.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: Iterations of each pass of the stage-1 projected Newton optimiser (10-35 suffice on the demo).
MAX_NEWTON_ITER = 100
#: Convergence threshold on the Newton decrement (see :func:`_projected_newton`).
NEWTON_TOL = 1e-12
#: Distance to a bound within which a variable pushed outwards is held at the bound.
EPS_BOUND = 1e-8


def _newton_direction(H: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Newton step ``-H^-1 g`` with ``H`` made positive definite.

    ``H`` is first scaled to unit diagonal (coefficients and noise parameters have curvatures
    many orders of magnitude apart), then its eigenvalues are replaced by their absolute values,
    floored at ``1e-13`` of the largest; a negative-curvature direction is thus followed downhill
    instead of towards the saddle.
    """
    if g.size == 0:
        return np.zeros(0)
    d = np.sqrt(np.abs(np.diag(H)))
    d[~(d > 0)] = 1.0
    w, V = np.linalg.eigh(H / np.outer(d, d))
    w = np.abs(w)
    w = np.maximum(w, 1e-13 * max(float(w.max()), 1e-300))
    return -(V @ ((V.T @ (g / d)) / w)) / d


@dataclass
class _NewtonResult:
    """Outcome of :func:`_projected_newton`."""

    x: np.ndarray
    f: float
    converged: bool
    n_iter: int
    message: str


def _projected_newton(fun: Callable[[np.ndarray, int], tuple], x0: np.ndarray, lo: np.ndarray,
                      hi: np.ndarray, max_iter: int = MAX_NEWTON_ITER, tol: float = NEWTON_TOL
                      ) -> _NewtonResult:
    """Minimise ``fun`` over the box ``lo <= x <= hi`` by projected Newton (Bertsekas 1982).

    Parameters
    ----------
    fun
        ``fun(x, order) -> (f, g, H)``: value, gradient (``order >= 1``) and Hessian
        (``order == 2``); ``None`` above the order asked for.
    x0
        Start (clipped into the box).
    lo, hi
        Bounds (``-inf`` / ``inf`` where there is none).
    max_iter
        Newton iterations.
    tol
        Convergence: the decrease predicted by the step, i.e. the Newton decrement
        ``g_F' H_FF^-1 g_F`` of the free variables (about the squared distance to the optimum in
        posterior-sd units) plus ``-g_B.(P(x + d) - x)_B`` of the binding ones, with every
        variable at a bound held there by its gradient.

    Returns
    -------
    _NewtonResult

    Notes
    -----
    Each iteration splits the variables into *binding* ones (within ``EPS_BOUND`` of a bound, the
    gradient pushing out of the box), which take a diagonally scaled gradient step (onto the
    bound, typically), and free ones, which take the Newton step of the free block
    (:func:`_newton_direction`); the step is searched along the projection arc ``P(x + alpha d)``
    (Armijo, halving ``alpha``). A free variable at a bound whose Newton component points out of
    the box is held for the iteration, so that the step is a descent direction; when the
    remaining step vanishes while such a variable has a gradient pointing into the box, a scaled
    gradient step on those variables is taken instead.
    """
    x = np.clip(np.asarray(x0, dtype=float), lo, hi)
    f, g, H = fun(x, 2)
    n = x.size
    slack = 8 * np.finfo(float).eps
    dec = np.inf
    for it in range(max_iter + 1):
        near_lo, near_hi = x - lo <= EPS_BOUND, hi - x <= EPS_BOUND
        bind = (near_lo & (g > 0)) | (near_hi & (g < 0))
        hdiag = np.maximum(np.abs(np.diag(H)), 1e-12)
        hold = np.zeros(n, dtype=bool)
        d = np.zeros(n)
        for _ in range(n + 1):
            free = ~bind & ~hold
            d[:] = 0.0
            d[free] = _newton_direction(H[np.ix_(free, free)], g[free])
            out = free & ((near_lo & (d < 0)) | (near_hi & (d > 0)))
            if not out.any():
                break
            hold |= out
        d[bind] = -g[bind] / hdiag[bind]
        # predicted decrease: Newton decrement of the free block, plus the binding variables' move
        dec = float(-g[free] @ d[free] - g[bind] @ (np.clip(x + d, lo, hi) - x)[bind])
        inward = hold & ((near_lo & (g < 0)) | (near_hi & (g > 0)))  # KKT violated at a bound
        if dec <= tol:
            if not inward.any():
                return _NewtonResult(x, f, True, it, f"Newton decrement {dec:.1e}")
            d = np.where(inward, -g / hdiag, 0.0)
        if it == max_iter:
            break
        alpha = 1.0
        while True:
            xn = np.clip(x + alpha * d, lo, hi)
            fn = fun(xn, 0)[0]
            # the projection can bend a long step away from descent: then shorten it; the slack
            # lets steps whose decrease is below the rounding of f be taken
            pred = float(g @ (xn - x))
            if pred < 0 and np.isfinite(fn) and fn <= f + 1e-4 * pred + slack * abs(f):
                fn, gn, Hn = fun(xn, 2)
                if np.isfinite(gn).all() and np.isfinite(Hn).all():
                    break
            alpha *= 0.5
            if alpha < 1e-12:
                ok = dec <= 1e-8 and not inward.any()
                return _NewtonResult(x, f, ok, it, f"line search failed, Newton decrement {dec:.1e}")
        x, f, g, H = xn, fn, gn, Hn
    return _NewtonResult(x, f, False, max_iter, f"no convergence, Newton decrement {dec:.1e}")
