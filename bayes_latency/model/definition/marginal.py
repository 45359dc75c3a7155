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

The Numba implementation is registered with a cache key, so PyTensor's on-disk Numba cache can
reuse the compiled graph in later processes (the key hashes the kernel's source).
Tried, not kept: the gradient from the diagonal of ``A^-1`` alone (``(A^-1 D I)_kk =
(1 - (A^-1)_kk) / d_k``): 18% less kernel time and 10% less per gradient of the demo fit, the same
posterior means, but other chains (rounding), one of which diverged once where this kernel's do
not.
The JAX implementation is registered only when the numpyro sampler asks for it
(:func:`register_jax`): importing JAX costs ~2.7 s that nutpie fits should not pay.
"""

from __future__ import annotations

import hashlib
import inspect

import numba
import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.link.numba.dispatch.basic import register_funcify_default_op_cache_key


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

    Only the coefficients with information (``info[c, k, k] > 0``) of each configuration enter
    its block. Written as loops over preallocated buffers, with ``A^-1`` formed once from the
    inverse Cholesky factor: 22 us per evaluation on the demo fleet (12 configurations, ~12
    coefficients each) against 31 us for the version built from small NumPy calls.
    """
    C, K = m.shape
    val = 0.0
    dm = np.zeros((C, K))
    dsig = np.zeros(K)
    idx = np.empty(K, dtype=np.int64)
    Ic = np.empty((K, K))
    L = np.zeros((K, K))
    Li = np.zeros((K, K))
    Ainv = np.empty((K, K))
    d = np.empty(K)
    r = np.empty(K)
    delta = np.empty(K)
    gc = np.empty(K)
    w = np.empty(K)
    y = np.empty(K)
    dt = np.empty(K)
    for c in range(C):
        n = 0
        for k in range(K):
            if info[c, k, k] > 0.0:
                idx[n] = k
                n += 1
        if n == 0:
            continue
        for a in range(n):
            ka = idx[a]
            d[a] = m[c, ka] * sig[ka]
            delta[a] = th[c, ka] - m[c, ka]
            gc[a] = g[c, ka]
            for b in range(n):
                Ic[a, b] = info[c, ka, idx[b]]
        # r = I (theta_hat - m) + g
        for a in range(n):
            acc = gc[a]
            for b in range(n):
                acc += Ic[a, b] * delta[b]
            r[a] = acc
        # A = 1 + D I D = L L'
        for a in range(n):
            for b in range(a + 1):
                acc = d[a] * Ic[a, b] * d[b] + (1.0 if a == b else 0.0)
                for j in range(b):
                    acc -= L[a, j] * L[b, j]
                if a == b:
                    L[a, a] = np.sqrt(acc)
                else:
                    L[a, b] = acc / L[b, b]
        # Li = L^-1 (lower triangular); A^-1 = Li' Li
        for a in range(n):
            Li[a, a] = 1.0 / L[a, a]
            for b in range(a):
                acc = 0.0
                for j in range(b, a):
                    acc -= L[a, j] * Li[j, b]
                Li[a, b] = acc / L[a, a]
        # y = A^-1 D r = Li' (Li (d r))
        for a in range(n):
            acc = 0.0
            for j in range(a + 1):
                acc += Li[a, j] * d[j] * r[j]
            w[a] = acc
        for a in range(n):
            acc = 0.0
            for j in range(a, n):
                acc += Li[j, a] * w[j]
            y[a] = acc
        # log Z = l(theta*) - y'y / 2 - log|A| / 2, theta* - theta_hat = d y - delta
        for a in range(n):
            dt[a] = d[a] * y[a] - delta[a]
        lin = 0.0
        quad = 0.0
        yy = 0.0
        for a in range(n):
            lin += dt[a] * gc[a]
            yy += y[a] * y[a]
            acc = 0.0
            for b in range(n):
                acc += Ic[a, b] * dt[b]
            quad += dt[a] * acc
        val += lin - 0.5 * quad - 0.5 * yy
        # A^-1 = Li' Li (symmetric: lower half into Ainv)
        for a in range(n):
            for b in range(a + 1):
                acc = 0.0
                for i in range(a, n):
                    acc += Li[i, a] * Li[i, b]
                Ainv[a, b] = acc
                Ainv[b, a] = acc
        for a in range(n):
            val -= np.log(L[a, a])
            # (A^-1 D I)_aa
            maa = 0.0
            for j in range(n):
                maa += Ainv[a, j] * d[j] * Ic[j, a]
            k = idx[a]
            yd = y[a] / d[a] if d[a] > 1e-300 else r[a]
            gd = y[a] * yd - maa
            dm[c, k] = yd + sig[k] * gd
            dsig[k] += m[c, k] * gd
    return np.array(val), dm, dsig


#: Salt of the Numba cache key of :class:`MarginalLoglik`: a hash of the kernel's source, so an
#: edited kernel never reuses a cached graph compiled with the old one.
KERNEL_VERSION = int(hashlib.sha256(inspect.getsource(marginal_kernel.py_func).encode()).hexdigest()[:12], 16)


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

    def infer_shape(self, node, shapes):  # noqa: ANN001
        return [(), shapes[0], shapes[1]]


marginal_op = MarginalLoglik()


def marginal_loglik_op(m, sig, th, g, info) -> pt.TensorVariable:  # noqa: ANN001
    """The summed configuration-marginal log-likelihood (first output of :class:`MarginalLoglik`)."""
    return marginal_op(m, sig, th, g, info)[0]


@register_funcify_default_op_cache_key(MarginalLoglik)
def _numba_marginal(op, node=None, **kwargs):  # noqa: ANN001, ANN202
    kernel = marginal_kernel

    @numba.njit
    def marginal(m, sig, th, g, info):  # noqa: ANN001, ANN202
        return kernel(np.ascontiguousarray(m), np.ascontiguousarray(sig), np.ascontiguousarray(th),
                      np.ascontiguousarray(g), np.ascontiguousarray(info))

    return marginal, KERNEL_VERSION


_JAX_REGISTERED = False


def register_jax() -> None:
    """Register the JAX implementation of :class:`MarginalLoglik` (for the numpyro sampler)."""
    global _JAX_REGISTERED
    if _JAX_REGISTERED:
        return
    from pytensor.link.jax.dispatch import jax_funcify

    jax_funcify.register(MarginalLoglik)(_jax_marginal)
    _JAX_REGISTERED = True


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
