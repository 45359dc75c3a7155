"""The configuration-marginal log-likelihood as one PyTensor Op with an analytic gradient.

For every configuration ``c`` the quadratic stage-1 summary (``theta_hat``, ``g``, ``I``) and the
Gaussian configuration residual ``theta ~ N(m, D)``, ``D^1/2 = diag(m * sigma)``, integrate in
closed form:

    r = I (theta_hat - m) + g,    A = 1 + D^1/2 I D^1/2,    y = A^-1 D^1/2 r,
    log Z = l(theta*) - y'y / 2 - log|A| / 2,    theta* = m + D^1/2 y,

with ``l`` the quadratic log-likelihood. By the envelope theorem (``theta*`` maximises
``l(theta) - |D^-1/2 (theta - m)|^2 / 2``), with ``d = m * sigma``:

    d logZ / d m_k     (at fixed d) = y_k / d_k
    d logZ / d d_k                  = y_k^2 / d_k - (A^-1 D^1/2 I)_kk

so value and gradient come out of one Cholesky per configuration. Written as a numba kernel
(compiled once and cached on disk) because PyTensor's generic linear-algebra graph took 30-110 s
to compile in Numba for this model; a JAX implementation serves the numpyro sampler.
"""

from __future__ import annotations

import numba
import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.link.jax.dispatch import jax_funcify
from pytensor.link.numba.dispatch import numba_funcify


@numba.njit(cache=True)
def marginal_kernel(m, sig, th, g, info):  # noqa: ANN001, ANN201 - numba kernel
    """Value and gradient of the summed configuration-marginal log-likelihood.

    Parameters
    ----------
    m : (C, K) population-implied coefficient means.
    sig : (K,) configuration residual scales (relative).
    th, g : (C, K) stage-1 maximum-likelihood points and gradients there.
    info : (C, K, K) observed information matrices.

    Returns
    -------
    (value as a 0-d array, d value / d m (C, K), d value / d sig (K,))
    """
    C, K = m.shape
    val = 0.0
    dm = np.zeros((C, K))
    dsig = np.zeros(K)
    for c in range(C):
        # only coefficients with information contribute; factorise that block only
        idx = np.empty(K, dtype=np.int64)
        n = 0
        for k in range(K):
            if info[c, k, k] > 0.0:
                idx[n] = k
                n += 1
        if n == 0:
            continue
        idx = idx[:n]
        Ic = np.empty((n, n))
        for a in range(n):
            for b in range(n):
                Ic[a, b] = info[c, idx[a], idx[b]]
        d = np.empty(n)
        r = np.empty(n)
        delta = np.empty(n)
        for a in range(n):
            d[a] = m[c, idx[a]] * sig[idx[a]]
            delta[a] = th[c, idx[a]] - m[c, idx[a]]
        for a in range(n):
            acc = g[c, idx[a]]
            for b in range(n):
                acc += Ic[a, b] * delta[b]
            r[a] = acc
        # A = 1 + D I D, Cholesky by hand (LAPACK call overhead dominates at n ~ 10)
        L = np.zeros((n, n))
        for a in range(n):
            for b in range(a + 1):
                acc = d[a] * Ic[a, b] * d[b] + (1.0 if a == b else 0.0)
                for j in range(b):
                    acc -= L[a, j] * L[b, j]
                if a == b:
                    L[a, a] = np.sqrt(acc)
                else:
                    L[a, b] = acc / L[b, b]
        # Linv (lower triangular), A^-1 = Linv' Linv
        Li = np.zeros((n, n))
        for a in range(n):
            Li[a, a] = 1.0 / L[a, a]
            for b in range(a):
                acc = 0.0
                for j in range(b, a):
                    acc -= L[a, j] * Li[j, b]
                Li[a, b] = acc / L[a, a]
        Ainv = Li.T @ Li
        y = Ainv @ (d * r)
        dt = d * y - delta
        gc = np.empty(n)
        for a in range(n):
            gc[a] = g[c, idx[a]]
        val += dt @ gc - 0.5 * (dt @ (Ic @ dt)) - 0.5 * (y @ y)
        for a in range(n):
            val -= np.log(L[a, a])
            # (A^-1 D I)_aa
            Maa = 0.0
            for j in range(n):
                Maa += Ainv[a, j] * d[j] * Ic[j, a]
            k = idx[a]
            yd = y[a] / d[a] if d[a] > 1e-300 else r[a]
            gd = y[a] * yd - Maa
            dm[c, k] = yd + sig[k] * gd
            dsig[k] += m[c, k] * gd
    return np.array(val), dm, dsig


class MarginalLoglik(Op):
    """``(m, sigma, theta_hat, g, info) -> (log Z, dlogZ/dm, dlogZ/dsigma)`` (see module docstring)."""

    __props__ = ()

    def make_node(self, m, sig, th, g, info):  # noqa: ANN001
        inputs = [pt.as_tensor_variable(x).astype("float64") for x in (m, sig, th, g, info)]
        outputs = [pt.dscalar(), pt.dmatrix(), pt.dvector()]
        return Apply(self, inputs, outputs)

    def perform(self, node, inputs, output_storage):  # noqa: ANN001
        val, dm, dsig = marginal_kernel(*[np.ascontiguousarray(x, dtype=np.float64) for x in inputs])
        output_storage[0][0] = np.asarray(val, dtype=np.float64)
        output_storage[1][0] = dm
        output_storage[2][0] = dsig

    def pullback(self, inputs, outputs, cotangents):  # noqa: ANN001
        """Vector-Jacobian product: the analytic gradient outputs times the value's cotangent."""
        _, dm, dsig = outputs
        gz = cotangents[0]
        zeros = [pt.zeros_like(x) for x in inputs[2:]]
        return [gz * dm, gz * dsig, *zeros]

    def infer_shape(self, fgraph, node, shapes):  # noqa: ANN001
        return [(), shapes[0], shapes[1]]


marginal_op = MarginalLoglik()


def marginal_loglik_op(m, sig, th, g, info) -> pt.TensorVariable:  # noqa: ANN001
    """The summed configuration-marginal log-likelihood (first output of :class:`MarginalLoglik`)."""
    return marginal_op(m, sig, th, g, info)[0]


@numba_funcify.register(MarginalLoglik)
def _numba_marginal(op, node=None, **kwargs):  # noqa: ANN001, ANN202
    kernel = marginal_kernel

    @numba.njit
    def marginal(m, sig, th, g, info):  # noqa: ANN001, ANN202
        return kernel(np.ascontiguousarray(m), np.ascontiguousarray(sig), np.ascontiguousarray(th),
                      np.ascontiguousarray(g), np.ascontiguousarray(info))

    return marginal


@jax_funcify.register(MarginalLoglik)
def _jax_marginal(op, **kwargs):  # noqa: ANN001, ANN202
    import jax
    import jax.numpy as jnp

    def one(m, sig, th, g, info):  # noqa: ANN001, ANN202
        K = m.shape[0]
        d = m * sig
        delta = th - m
        r = info @ delta + g
        A = d[:, None] * info * d[None, :] + jnp.eye(K)
        L = jnp.linalg.cholesky(A)
        y = jax.scipy.linalg.cho_solve((L, True), d * r)
        dt = d * y - delta
        return dt @ g - 0.5 * dt @ (info @ dt) - 0.5 * y @ y - jnp.sum(jnp.log(jnp.diag(L)))

    def total(m, sig, th, g, info):  # noqa: ANN001, ANN202
        return jnp.sum(jax.vmap(one, in_axes=(0, None, 0, 0, 0))(m, sig, th, g, info))

    def marginal(m, sig, th, g, info):  # noqa: ANN001, ANN202
        val, (dm, dsig) = jax.value_and_grad(total, argnums=(0, 1))(m, sig, th, g, info)
        return val, dm, dsig

    return marginal
