"""Which coefficients the observation table can tell apart, before any sampling.

Every fitted row is linear in the coefficients: ``y ~ x . theta``. Within one configuration the
data identify only the directions in which the rows' features vary independently. On real vLLM
traces several directions are flat:

* ``weight_loading``, ``per_layer`` and ``per_step`` are constant per step of a configuration
  (dense models), so one configuration identifies only their sum;
* without speculative decoding a decoding request contributes one token, so ``decode_compute``
  (decode tokens) and ``per_request`` (requests) move together on decode-only steps;
* ``tp_allreduce`` scales with all tokens of the step, i.e. with ``prefill_compute`` (prefill
  tokens) plus ``decode_compute`` (decode tokens).

The hierarchy can still separate such coefficients through the *differences between*
configurations (their feature ratios differ with model size and TP degree), but with few
configurations the posterior of a flat direction is the prior's, and when the data ask for a
sum far from what the priors expect, lognormal priors make "one term carries it" corners:
NUTS chains settle in different corners (R-hat 1.8 measured on the two real H100 runs with
all 11 terms). :func:`identifiability` finds those groups so that a fit can say so, and so that
a user can choose a term set the data support.

The analysis is the singular value decomposition of each configuration's *relative* design:
rows divided by their observed value (``d log mu / d theta`` up to the coefficient scale), columns
multiplied by the coefficient's typical size (the prior median), so singular values compare
like with like.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

#: A direction is flat when its singular value (relative design, coefficients in prior-median
#: units) is below this: with ~5% noise per row the data's precision along it is then below
#: (0.01 / 0.05)^2 = 1/25 of a prior median's, i.e. the prior speaks. Measured gaps: on the
#: demo fleet flat directions sit at 1e-4 and below, weak but real ones (decode_kv, the alpha
#: pair) at 0.02-0.08; on the real H100 runs the per_request/decode_compute direction at 0.005.
ABS_TOL = 0.01
#: A coefficient belongs to a flat direction when its weight in the unit null vector exceeds this.
MEMBER_TOL = 0.05


@dataclass
class ConfigIdentifiability:
    """Identifiability of one configuration's coefficients.

    Attributes
    ----------
    config_id
        The configuration.
    active
        Coefficients with a non-zero feature in at least one row.
    rank
        Number of directions the rows identify (singular values above ``ABS_TOL``).
    groups
        Sets of active coefficients that the rows identify only jointly (connected through flat
        directions), largest first.
    null_vectors
        The flat directions, as ``{coefficient: weight}`` of unit vectors in scaled coordinates.
    """

    config_id: str
    active: list[str]
    rank: int
    groups: list[list[str]]
    null_vectors: list[dict[str, float]] = field(default_factory=list)


@dataclass
class IdentifiabilityReport:
    """Per-configuration analysis plus the groups that no configuration separates."""

    configs: list[ConfigIdentifiability]

    @property
    def confounded_everywhere(self) -> list[list[str]]:
        """Groups of coefficients that are flat in every configuration where they are active.

        A pair of coefficients is "separated" by a configuration when both are active there and
        they do not fall in one group, unless each of them is flat on its own there (two groups of
        one: the rows say nothing of either, so they cannot tell them apart). Returned groups are
        connected components of the pairs no configuration separates.

        Counting such configurations as separating left ``per_layer`` and ``per_step`` (one group
        in every other configuration) with their ARD gates on the real data, where the Splitwise
        Bloom-176B and Llama-2-70B A100 TP2 benchmark means leave each flat on its own; the
        gates' corners made the population posterior mix slowly. The client study's refit
        without Mixtral codegen at ``fit``'s defaults: R-hat 1.012, bulk ESS 109 at the
        12,000-draw cap in 573 s with the gates; 1.0021 / 469 in 48 s
        without. At 2 x 500 draws, three refits: R-hat 1.153 / 1.079 / 1.153 ->
        1.052 / 1.016 / 1.061, bulk ESS 13 / 17 / 12 -> 53 / 64 / 29.
        """
        pairs: dict[tuple[str, str], bool] = {}
        for c in self.configs:
            member = {t: i for i, g in enumerate(c.groups) for t in g}
            alone = {g[0] for g in c.groups if len(g) == 1}
            for i, a in enumerate(c.active):
                for b in c.active[i + 1:]:
                    if a in alone and b in alone:
                        continue
                    key = (min(a, b), max(a, b))
                    joint = a in member and b in member and member[a] == member[b]
                    pairs[key] = pairs.get(key, True) and joint
        return _components([k for k, v in pairs.items() if v])

    def involved(self, coefs: Sequence[str]) -> list[list[str]]:
        """The groups of :attr:`confounded_everywhere` that contain any of ``coefs``."""
        s = set(coefs)
        return [g for g in self.confounded_everywhere if s.intersection(g)]

    def to_dict(self) -> list[dict]:
        """Plain data (JSON-ready); :meth:`from_dict` restores the report."""
        return [{"config_id": c.config_id, "active": list(c.active), "rank": int(c.rank),
                 "groups": [list(g) for g in c.groups],
                 "null_vectors": [{k: float(v) for k, v in nv.items()} for nv in c.null_vectors]}
                for c in self.configs]

    @classmethod
    def from_dict(cls, data: list[dict]) -> IdentifiabilityReport:
        """The report written by :meth:`to_dict`."""
        return cls([ConfigIdentifiability(**c) for c in data])

    def to_frame(self) -> pd.DataFrame:
        """One row per configuration: active count, rank, and the flat groups."""
        return pd.DataFrame([{"config_id": c.config_id, "n_active": len(c.active), "rank": c.rank,
                              "flat_groups": "; ".join("+".join(g) for g in c.groups) or "-"}
                             for c in self.configs])

    def summary(self) -> str:
        """A few lines for logs and error messages."""
        lines = [f"{c.config_id}: rank {c.rank} of {len(c.active)} active coefficients"
                 + (f"; identified only jointly: {', '.join('+'.join(g) for g in c.groups)}"
                    if c.groups else "") for c in self.configs]
        every = self.confounded_everywhere
        if every:
            lines.append("no configuration separates: " + ", ".join("+".join(g) for g in every))
        return "\n".join(lines)


def _components(pairs: list[tuple[str, str]]) -> list[list[str]]:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for x in parent:
        groups.setdefault(find(x), []).append(x)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: (-len(g), g))


def config_identifiability(X: np.ndarray, y: np.ndarray, coefs: Sequence[str], scale: np.ndarray,
                           config_id: str = "") -> ConfigIdentifiability:
    """Identifiability of one configuration from its feature matrix.

    Parameters
    ----------
    X
        ``(n, K)`` features of the configuration's fitted rows.
    y
        ``(n,)`` observed values (positive), the row scale of the relative design.
    coefs
        Names of the ``K`` coefficients.
    scale
        ``(K,)`` typical coefficient sizes (prior medians).
    config_id
        Label for the report.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    if X.ndim != 2 or X.shape[1] != len(coefs) or len(y) != len(X):
        raise ValueError(f"X {X.shape}, y {y.shape} and {len(coefs)} coefficients do not line up")
    active = (X > 0).any(axis=0)
    names = [c for c, a in zip(coefs, active, strict=True) if a]
    if not names:
        return ConfigIdentifiability(config_id, [], 0, [])
    A = X[:, active] * np.asarray(scale, dtype=float)[active][None, :] / y[:, None]
    # the right singular vectors of A are the eigenvectors of A'A (K x K; never form U, n x n)
    w, vecs = np.linalg.eigh(A.T @ A)
    order = np.argsort(w)[::-1]
    s, vt = np.sqrt(np.clip(w[order], 0.0, None)), vecs[:, order].T
    flat = s < ABS_TOL
    nulls = [{n: float(x) for n, x in zip(names, vt[i], strict=True) if abs(x) > MEMBER_TOL}
             for i in np.flatnonzero(flat)]
    # groups from the projector onto the flat subspace (basis-free: the choice of null vectors
    # inside a multi-dimensional flat subspace is arbitrary)
    N = vt[np.flatnonzero(flat)].T
    P = N @ N.T
    involved = np.diag(P) > MEMBER_TOL**2
    pairs = [(names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))
             if involved[i] and involved[j] and abs(P[i, j]) > MEMBER_TOL**2]
    linked = {x for p in pairs for x in p}
    groups = _components(pairs) + [[names[i]] for i in np.flatnonzero(involved)
                                   if names[i] not in linked]
    return ConfigIdentifiability(config_id, names, int((~flat).sum()), groups, nulls)


def identifiability(rows: pd.DataFrame, coefs: Sequence[str], scale: np.ndarray) -> IdentifiabilityReport:
    """Analyse every configuration of an observation table (fitted rows, ``x_<coef>`` columns).

    Parameters
    ----------
    rows
        Rows with ``config_id``, ``value_us`` and ``x_<coef>`` for every coefficient.
    coefs
        Coefficient names.
    scale
        Typical coefficient sizes (prior medians), same order as ``coefs``.
    """
    cols = [f"x_{c}" for c in coefs]
    missing = [c for c in cols + ["config_id", "value_us"] if c not in rows.columns]
    if missing:
        raise ValueError(f"identifiability: rows lack columns {missing}")
    out = []
    for cid, g in rows.groupby("config_id", sort=True):
        out.append(config_identifiability(g[cols].to_numpy(float), g["value_us"].to_numpy(float),
                                          coefs, scale, str(cid)))
    return IdentifiabilityReport(out)


#: Two coefficients form a sum-only pair when, in every configuration where either is active,
#: both are active on the same rows and the ratio of their features varies by less than this
#: (coefficient of variation). Exactly 0 for the terms that are constant per step of a
#: configuration (``weight_loading``, ``per_layer``, ``per_step`` of dense models); 0.5-1% for the
#: departure pair ``alpha_post_decode`` + ``alpha_per_token`` (``1`` and the output length, nearly
#: constant per configuration on the tiny fleet: 247-248 tokens).
RATIO_CV_TOL = 0.05


@dataclass
class SumGroup:
    """Coefficients that every configuration sees (almost) only through one weighted sum.

    Attributes
    ----------
    coefs
        The coefficients (in the order of the fit's coefficients).
    weights
        ``(n,)`` typical feature ratios, ``weights[0] = 1``: the rows see (nearly)
        ``sum_k weights[k] * theta[k]`` times a per-row factor.
    """

    coefs: list[str]
    weights: np.ndarray
    #: per configuration where the group is active, its own feature ratios (``[0] = 1``)
    config_weights: dict[str, np.ndarray] = field(default_factory=dict)
    #: False for a near pair (:func:`near_pairs`): the features are proportional only on the
    #: rows where both are non-zero (the model treats it as a group all the same)
    exact: bool = True


#: Largest spread across configurations (``max - min`` of the log of a member's feature ratio to
#: the group's first member) for an exact group to be sampled as a sum (:func:`pooled_groups`).
#: Configurations that weigh the members differently identify the split between them, and the
#: split is what carries over to an unseen configuration: on the real data ``weight_loading`` +
#: ``per_layer`` + ``per_step`` are proportional within every configuration, but the weight bytes
#: per layer differ 3.3x across models. Sampled as a sum (split left to the prior), the
#: leave-one-model-out E2E of the real runs in BLIS went from 6.1% (median; before the groups)
#: to 20.2% (Code Llama -20%, Llama-2-7B +20-28%, Mixtral -20%); with this limit the real data
#: have no exact group and the package's replay of the held-out models' stages is off by
#: +2.9% / +9.3% / +0.8% (median over stages; Code Llama / Llama-2-7B / Mixtral), against
#: +3.1% / -0.5% (Code Llama / Llama-2-7B) before the groups. log(1.25).
MAX_WEIGHT_SPREAD = math.log(1.25)


def weight_spread(group: SumGroup) -> float:
    """Largest spread across configurations of the log feature ratio of a member to the first
    (0 when the group is seen in one configuration)."""
    logs = _log_config_weights(group)
    return 0.0 if len(logs) < 2 else float(np.max(np.ptp(logs, axis=0)))


def _log_config_weights(group: SumGroup) -> np.ndarray:
    """``(configuration, member)`` log feature ratios of ``group`` (in ``config_weights`` order)."""
    return np.log(np.stack([np.asarray(w, dtype=float) for w in group.config_weights.values()])
                  ) if group.config_weights else np.zeros((0, len(group.coefs)))


def pooled_groups(rows: pd.DataFrame, coefs: Sequence[str],
                  max_spread: float = MAX_WEIGHT_SPREAD) -> list[SumGroup]:
    """The groups the model samples as sums: the exact groups of :func:`sum_groups` whose
    weights agree across configurations (:data:`MAX_WEIGHT_SPREAD`), then the :func:`near_pairs`
    among the coefficients of no exact group (a member of a group left out for its spread is not
    paired again)."""
    exact = sum_groups(rows, coefs)
    kept = [sub for g in exact for sub in _consistent_subgroups(g, max_spread)]
    return kept + near_pairs(rows, coefs, [c for g in exact for c in g.coefs])


def _consistent_subgroups(group: SumGroup, max_spread: float) -> list[SumGroup]:
    """Split ``group`` into subgroups (of 2 or more members) whose feature ratios agree across
    configurations within ``max_spread``, greedily from the first member (e.g. ``per_layer`` +
    ``per_step`` of one model on two GPUs stay a group while ``weight_loading``, whose feature
    is divided by each GPU's bandwidth, leaves it)."""
    cfgs = list(group.config_weights)
    if len(cfgs) < 2:
        return [group]
    logs = _log_config_weights(group)
    left, out = list(range(len(group.coefs))), []
    while len(left) >= 2:
        a = left[0]
        sub = [b for b in left if np.ptp(logs[:, b] - logs[:, a]) <= max_spread]
        left = [b for b in left if b not in sub]
        if len(sub) < 2:
            continue
        w = np.asarray(group.weights, dtype=float)[sub]
        cw = {c: np.asarray(group.config_weights[c], dtype=float)[sub] for c in cfgs}
        out.append(SumGroup([group.coefs[b] for b in sub], w / w[0],
                            {c: v / v[0] for c, v in cw.items()}, exact=group.exact))
    return out


def sum_groups(rows: pd.DataFrame, coefs: Sequence[str],
               tol: float = RATIO_CV_TOL) -> list[SumGroup]:
    """Groups of coefficients whose features are proportional on every row of every configuration.

    Such coefficients are identified per configuration only as a sum ``sum_k w_k theta_k``; the
    model samples that sum's population level in its own coordinate
    (:func:`bayes_latency.model.definition.hierarchy._population`). Unlike
    :attr:`IdentifiabilityReport.confounded_everywhere` (flat directions at a fixed tolerance,
    which a weak but non-zero variation such as the output length of the departure rows escapes),
    this tests the features' ratio directly.

    Parameters
    ----------
    rows
        Fitted rows with ``config_id`` and ``x_<coef>`` columns.
    coefs
        Coefficient names.
    tol
        Largest coefficient of variation of a feature ratio within a configuration.
    """
    X = rows[[f"x_{c}" for c in coefs]].to_numpy(dtype=float)
    cfg = rows["config_id"].to_numpy()
    K = len(coefs)
    linked = np.ones((K, K), dtype=bool)
    seen = np.zeros((K, K), dtype=bool)
    log_ratio: dict[tuple[int, int], list[float]] = {}
    per_config: dict[tuple[int, int], dict[str, float]] = {}
    for c in np.unique(cfg):
        Xc = X[cfg == c]
        nz = Xc != 0
        act = nz.any(axis=0)
        for i in range(K):
            for j in range(i + 1, K):
                if not (act[i] or act[j]):
                    continue
                seen[i, j] = True
                if not (act[i] and act[j]) or not np.array_equal(nz[:, i], nz[:, j]):
                    linked[i, j] = False
                    continue
                r = Xc[nz[:, i], j] / Xc[nz[:, i], i]
                if not (np.all(r > 0) and np.std(r) <= tol * np.mean(r)):
                    linked[i, j] = False
                    continue
                log_ratio.setdefault((i, j), []).append(float(np.log(np.median(r))))
                per_config.setdefault((i, j), {})[str(c)] = float(np.median(r))
    pairs = [(coefs[i], coefs[j]) for i in range(K) for j in range(i + 1, K)
             if seen[i, j] and linked[i, j]]
    out = []
    for g in _components(pairs):
        idx = sorted(coefs.index(t) for t in g)
        # a component is a group only when every pair in it is linked (a clique)
        if not all(linked[a, b] and seen[a, b] for n, a in enumerate(idx) for b in idx[n + 1:]):
            continue
        w = np.ones(len(idx))
        for n, b in enumerate(idx[1:], start=1):
            w[n] = float(np.exp(np.mean(log_ratio[(idx[0], b)])))  # geometric mean over configs
        cw = {c: np.asarray([1.0] + [per_config[(idx[0], b)][c] for b in idx[1:]])
              for c in per_config.get((idx[0], idx[1]), {})}
        out.append(SumGroup([coefs[i] for i in idx], w, cw))
    return out


#: Least share of the rows where either member of a near pair is active on which both are (and
#: proportional): ``decode_compute`` / ``per_request`` share every decode row; a coincidence such
#: as a fixed prompt length (``prefill_kv`` against a per-step term on prefill rows only) does not.
NEAR_PAIR_SHARE = 0.5


def near_pairs(rows: pd.DataFrame, coefs: Sequence[str], exclude: Sequence[str] = (),
               tol: float = RATIO_CV_TOL) -> list[SumGroup]:
    """Pairs of coefficients whose features are proportional on every row where both are non-zero
    (in every configuration where both are active), and each active elsewhere at most alone.

    ``decode_compute`` and ``per_request`` without speculative decoding: a decode-only step has one
    token per request, so the decode rows see only their sum; prefill rows add ``per_request``
    alone, but at its size (microseconds per request against milliseconds of prefill) they barely
    tell it apart. On the real data the two made a bimodal posterior ("one of them carries the
    decode cost"). The estimator passes such a pair to the model with the :func:`sum_groups`
    groups, so it is treated like one (sum coordinate, shared factor effects, ``_sum_shift``; see
    :mod:`bayes_latency.model.definition.hierarchy`): the rows where one of them is active alone are left to
    the configuration residual. Sampled only in the sum's coordinate with their own effects, the
    pair stayed bimodal (R-hat 1.245).
    Coefficients in ``exclude`` (members of the exact groups) are left out; the pair must share at
    least :data:`NEAR_PAIR_SHARE` of the rows where either is active, in every configuration;
    pairs are disjoint, the one with the most shared rows first.
    """
    X = rows[[f"x_{c}" for c in coefs]].to_numpy(dtype=float)
    cfg = rows["config_id"].to_numpy()
    K = len(coefs)
    # each configuration's rows and their non-zero masks, computed once for every pair
    per_cfg = []
    for c in np.unique(cfg):
        Xc = X[cfg == c]
        per_cfg.append((c, Xc, Xc != 0))
    cand = []
    for i in range(K):
        for j in range(i + 1, K):
            if coefs[i] in exclude or coefs[j] in exclude:
                continue
            ok, logs, shared, cw = True, [], 0, {}
            for c, Xc, nz in per_cfg:
                both = nz[:, i] & nz[:, j]
                if not both.any():
                    if nz[:, i].any() and nz[:, j].any():
                        ok = False  # both active, never together: not a sum there
                        break
                    continue
                r = Xc[both, j] / Xc[both, i]
                either = nz[:, i] | nz[:, j]
                if not (np.all(r > 0) and np.std(r) <= tol * np.mean(r)
                        and both.sum() >= NEAR_PAIR_SHARE * either.sum()):
                    ok = False
                    break
                logs.append(float(np.log(np.median(r))))
                cw[str(c)] = np.asarray([1.0, float(np.median(r))])
                shared += int(both.sum())
            if ok and logs:
                cand.append((shared, i, j, float(np.exp(np.mean(logs))), cw))
    out, used = [], set()
    for _, i, j, w, cw in sorted(cand, key=lambda t: (-t[0], t[1], t[2])):
        if i in used or j in used:
            continue
        used |= {i, j}
        out.append(SumGroup([coefs[i], coefs[j]], np.asarray([1.0, w]), cw, exact=False))
    return out
