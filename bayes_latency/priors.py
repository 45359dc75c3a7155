"""Prior files (``priors/*.yaml``): loading, validation and lookup.

Schema (``schema_version: 1``; see ``priors/README.md``)::

    schema_version: 1
    terms:          # one lognormal entry per term of the term set and per alpha term
      prefill_compute: {dist: lognormal, median: 2.0, sigma: 0.7, rationale: "..."}
    gpu_overrides:  # optional: per GPU name (aliases allowed), partial term entries
      A100-80GB: {prefill_compute: {median: 2.5}}
    hierarchy:      # scales of the crossed model / gpu / tp effects on log-coefficients
      model: {dist: halfnormal, sigma: 0.25}
      gpu:   {dist: halfnormal, sigma: 0.3}
      tp:    {dist: halfnormal, sigma: 0.3}
    ard: {dist: logistic_gate, loc: -1.5, scale: 1.0, sharpness: 4.0}
    noise:          # per observation kind: log-residual scale and Student-t dof
      iteration: {sigma: {dist: halfnormal, sigma: 0.5}, nu: {dist: gamma, alpha: 2, beta: 0.1}}

Every validation problem raises :class:`~bayes_latency.errors.PriorError` with the file, the
term (or section) and the field in the message.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bayes_latency.errors import PriorError
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, TERMS
from bayes_latency.physics.hardware import GPU, resolve_gpu_name
from bayes_latency.textfiles import load_yaml, read_text, refuse_special

SCHEMA_VERSION = 1
"""The prior-file schema this module reads."""

DEFAULT_PRIORS_PATH = Path(__file__).resolve().parents[1] / "priors" / "default.yaml"
"""The repository's default prior file."""

DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "lognormal": ("median", "sigma"),
    "normal": ("mu", "sigma"),
    "halfnormal": ("sigma",),
    "gamma": ("alpha", "beta"),
    "beta": ("alpha", "beta"),
    "exponential": ("lam",),
    "logistic_gate": ("loc", "scale", "sharpness"),
}
"""Known distributions and their (all required) parameters."""

_POSITIVE = {"median", "sigma", "alpha", "beta", "lam", "scale", "sharpness"}
_POSITIVE_SUPPORT = ("halfnormal", "gamma", "exponential", "lognormal")
HIERARCHY_EFFECTS: tuple[str, ...] = ("model", "gpu", "tp")
"""Crossed effects whose scales ``hierarchy`` must give."""
REQUIRED_NOISE_KINDS: tuple[str, ...] = (
    "iteration", "step_window", "benchmark_mean", "alpha_arrival", "alpha_departure",
    "request_prefill", "request_decode",
)
"""Observation kinds that ``noise`` must cover."""
_TOP_KEYS = {"schema_version", "terms", "gpu_overrides", "hierarchy", "ard", "noise", "description"}
_NOISE_PARAMS = ("sigma", "nu")


#: Factors whose effects a prior file may switch off for some terms (``hierarchy.<f>.without``).
WITHOUT_FACTORS: tuple[str, ...] = ("model", "gpu", "tp", "stack")


def _check_without(value: object, factor: str, terms: set[str], src: str) -> tuple[str, ...]:
    """``hierarchy.<factor>.without``: a list of known term names, for a crossed factor."""
    where = f"hierarchy {factor!r}"
    if factor not in WITHOUT_FACTORS:
        raise _fail(src, where, "without", f"only the factors {list(WITHOUT_FACTORS)} take it")
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise _fail(src, where, "without", f"expected a list of term names, got {value!r}")
    for name in value:
        if not isinstance(name, str) or name not in terms:
            raise _fail(src, where, "without", f"{name!r} is not a known term")
    return tuple(str(n) for n in value)


def _fail(src: str, where: str, fld: str | None, msg: str) -> PriorError:
    f = f", field {fld!r}" if fld else ""
    return PriorError(f"{src}: {where}{f}: {msg}")


def _check_dist(entry: Any, src: str, where: str, *, allow_rationale: bool = True,
                allowed: Sequence[str] | None = None) -> dict[str, Any]:
    """Validate one distribution entry and return it normalised (floats)."""
    if not isinstance(entry, Mapping):
        raise _fail(src, where, None, f"expected a mapping with 'dist', got {entry!r}")
    dist = entry.get("dist")
    if dist is None:
        raise _fail(src, where, "dist", "missing")
    if dist not in DISTRIBUTIONS:
        raise _fail(src, where, "dist", f"unknown distribution {dist!r}; known: "
                    f"{', '.join(DISTRIBUTIONS)}")
    if allowed is not None and dist not in allowed:
        raise _fail(src, where, "dist", f"{dist!r} not allowed here; use one of {list(allowed)}")
    params = DISTRIBUTIONS[dist]
    extra = set(entry) - set(params) - {"dist"} - ({"rationale"} if allow_rationale else set())
    if extra:
        raise _fail(src, where, sorted(extra)[0], f"unknown key(s) {sorted(extra)} for dist "
                    f"{dist!r}; expected {list(params)}")
    out: dict[str, Any] = {"dist": dist}
    for p in params:
        if p not in entry or entry[p] is None:
            raise _fail(src, where, p, f"missing (dist {dist!r} needs {list(params)})")
        v = entry[p]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _fail(src, where, p, f"must be a number, got {v!r}")
        v = float(v)
        if not math.isfinite(v):
            raise _fail(src, where, p, f"must be finite, got {v!r}")
        if p in _POSITIVE and v <= 0:
            raise _fail(src, where, p, f"must be > 0, got {v!r}")
        out[p] = v
    if "rationale" in entry:
        if not isinstance(entry["rationale"], str):
            raise _fail(src, where, "rationale", "must be a string")
        out["rationale"] = entry["rationale"]
    return out


@dataclass(frozen=True)
class PriorSet:
    """Validated priors.

    Attributes
    ----------
    path : str
        File the priors were read from (``"<dict>"`` for in-memory content).
    terms : dict[str, dict]
        Term name -> entry (``dist``, parameters, optional ``rationale``), without GPU overrides.
    gpu_overrides : dict[str, dict[str, dict]]
        Canonical GPU name -> term -> partial entry.
    hierarchy : dict[str, dict]
        Effect (``model``, ``gpu``, ``tp``, ...) -> scale prior.
    ard : dict
        Relevance prior.
    noise : dict[str, dict[str, dict]]
        Observation kind -> ``{"sigma": prior, "nu": prior}``.
    schema_version : int
    """

    path: str
    terms: dict[str, dict[str, Any]]
    gpu_overrides: dict[str, dict[str, dict[str, Any]]]
    hierarchy: dict[str, dict[str, Any]]
    ard: dict[str, Any]
    noise: dict[str, dict[str, dict[str, Any]]]
    schema_version: int = SCHEMA_VERSION
    _hash: str = field(default="", repr=False)

    @property
    def hash(self) -> str:
        """sha256 (hex) of the canonical JSON of the validated content (path excluded)."""
        return self._hash

    def content(self) -> dict[str, Any]:
        """The validated content as a plain dict (what :attr:`hash` is computed from)."""
        return {"schema_version": self.schema_version, "terms": copy.deepcopy(self.terms),
                "gpu_overrides": copy.deepcopy(self.gpu_overrides),
                "hierarchy": copy.deepcopy(self.hierarchy), "ard": dict(self.ard),
                "noise": copy.deepcopy(self.noise)}

    @property
    def term_names(self) -> list[str]:
        """Terms that have a prior (file order)."""
        return list(self.terms)

    def _gpu_key(self, gpu: str | GPU | None) -> str | None:
        if gpu is None:
            return None
        name = gpu.name if isinstance(gpu, GPU) else str(gpu)
        canon = resolve_gpu_name(name) or name
        if canon in self.gpu_overrides:
            return canon
        return name if name in self.gpu_overrides else None

    def term(self, name: str, gpu: str | GPU | None = None) -> dict[str, Any]:
        """Prior entry of term ``name``, with the overrides of ``gpu`` (name, alias or GPU) merged.

        Raises
        ------
        PriorError
            No prior for ``name``.
        """
        if name not in self.terms:
            raise PriorError(f"{self.path}: term {name!r}: no prior (terms with priors: "
                             f"{', '.join(self.terms)})")
        entry = dict(self.terms[name])
        key = self._gpu_key(gpu)
        if key is not None and name in self.gpu_overrides[key]:
            entry.update(self.gpu_overrides[key][name])
        return entry

    def prior_median(self, term: str, gpu: str | GPU | None = None) -> float:
        """Prior median of a (lognormal) term coefficient."""
        return float(self.term(term, gpu)["median"])

    def log_mean_sd(self, term: str, gpu: str | GPU | None = None) -> tuple[float, float]:
        """``(mu, sd)`` of the log-coefficient: ``(log(median), sigma)``."""
        e = self.term(term, gpu)
        return math.log(e["median"]), float(e["sigma"])

    def hierarchy_scale(self, effect: str) -> dict[str, Any]:
        """Scale prior of a crossed effect (``model``, ``gpu``, ``tp``)."""
        if effect not in self.hierarchy:
            raise PriorError(f"{self.path}: hierarchy {effect!r}: missing (have "
                             f"{', '.join(self.hierarchy)})")
        return {k: v for k, v in self.hierarchy[effect].items() if k not in ("spread", "without")}

    def hierarchy_without(self, effect: str) -> tuple[str, ...]:
        """Terms without an effect of factor ``effect`` (``hierarchy.<effect>.without``)."""
        return tuple(self.hierarchy.get(effect, {}).get("without", ()))

    def noise_prior(self, kind: str) -> dict[str, dict[str, Any]]:
        """``{"sigma": prior, "nu": prior}`` of an observation kind."""
        if kind not in self.noise:
            raise PriorError(f"{self.path}: noise kind {kind!r}: missing (have "
                             f"{', '.join(self.noise)})")
        return copy.deepcopy(self.noise[kind])


def _canonical_hash(content: Mapping[str, Any]) -> str:
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def parse_priors(raw: Any, source: str = "<dict>", terms: Sequence[str] = DEFAULT_TERMS,
                 alpha_terms: Sequence[str] = ALPHA_TERMS) -> PriorSet:
    """Validate parsed prior content (see :func:`load_priors`)."""
    src = source
    if not isinstance(raw, Mapping):
        raise _fail(src, "top level", None, "expected a mapping")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise _fail(src, "top level", sorted(unknown)[0],
                    f"unknown key(s) {sorted(unknown)}; expected {sorted(_TOP_KEYS)}")
    ver = raw.get("schema_version")
    if ver != SCHEMA_VERSION or isinstance(ver, bool):
        raise _fail(src, "top level", "schema_version",
                    f"unsupported schema_version {ver!r}; this version reads {SCHEMA_VERSION}")

    # terms
    raw_terms = raw.get("terms")
    if not isinstance(raw_terms, Mapping) or not raw_terms:
        raise _fail(src, "section 'terms'", "terms", "missing or not a mapping")
    known = set(TERMS) | set(ALPHA_TERMS) | set(terms) | set(alpha_terms)
    parsed_terms: dict[str, dict[str, Any]] = {}
    for name, entry in raw_terms.items():
        if name not in known:
            raise _fail(src, f"term {name!r}", "terms", f"unknown term; known: {sorted(known)}")
        parsed_terms[str(name)] = _check_dist(entry, src, f"term {name!r}", allowed=("lognormal",))
    for name in (*terms, *alpha_terms):
        if name not in parsed_terms:
            raise _fail(src, f"term {name!r}", "terms", "missing (every term of the term set and "
                        "every alpha term needs a prior)")

    # gpu overrides
    overrides: dict[str, dict[str, dict[str, Any]]] = {}
    raw_ov = raw.get("gpu_overrides") or {}
    if not isinstance(raw_ov, Mapping):
        raise _fail(src, "section 'gpu_overrides'", "gpu_overrides", "not a mapping")
    for gname, tmap in raw_ov.items():
        canon = resolve_gpu_name(str(gname)) or str(gname)
        if not isinstance(tmap, Mapping):
            raise _fail(src, f"gpu_overrides {gname!r}", None, "expected a mapping term -> entry")
        dest = overrides.setdefault(canon, {})
        for tname, partial in tmap.items():
            where = f"gpu_overrides {gname!r} term {tname!r}"
            if tname not in parsed_terms:
                raise _fail(src, where, tname, "override of a term that has no prior")
            if not isinstance(partial, Mapping):
                raise _fail(src, where, None, "expected a mapping of fields")
            merged = {**parsed_terms[tname], **partial}
            if "dist" not in partial and "rationale" not in partial:
                merged.pop("rationale", None)
            checked = _check_dist(merged, src, where, allowed=("lognormal",))
            dest[str(tname)] = {k: checked[k] for k in partial if k in checked}

    # hierarchy
    raw_h = raw.get("hierarchy")
    if not isinstance(raw_h, Mapping):
        raise _fail(src, "section 'hierarchy'", "hierarchy", "missing or not a mapping")
    hierarchy = {}
    for k, v in raw_h.items():
        spread = v.get("spread") if isinstance(v, Mapping) else None
        without = v.get("without") if isinstance(v, Mapping) else None
        entry = ({kk: vv for kk, vv in v.items() if kk not in ("spread", "without")}
                 if isinstance(v, Mapping) else v)
        hierarchy[str(k)] = _check_dist(entry, src, f"hierarchy {k!r}", allowed=_POSITIVE_SUPPORT)
        if spread is not None:
            if isinstance(spread, bool) or not isinstance(spread, (int, float)) \
                    or not math.isfinite(float(spread)) or float(spread) <= 0:
                raise _fail(src, f"hierarchy {k!r}", "spread", f"must be a number > 0, got {spread!r}")
            hierarchy[str(k)]["spread"] = float(spread)
        if without is not None:
            hierarchy[str(k)]["without"] = _check_without(without, str(k), known, src)
    for eff in HIERARCHY_EFFECTS:
        if eff not in hierarchy:
            raise _fail(src, f"hierarchy {eff!r}", "hierarchy", "missing effect scale")

    # ard
    if "ard" not in raw:
        raise _fail(src, "section 'ard'", "ard", "missing")
    ard = _check_dist(raw["ard"], src, "ard", allowed=("logistic_gate", "beta"))

    # noise
    raw_n = raw.get("noise")
    if not isinstance(raw_n, Mapping):
        raise _fail(src, "section 'noise'", "noise", "missing or not a mapping")
    noise: dict[str, dict[str, dict[str, Any]]] = {}
    for kind, pair in raw_n.items():
        where = f"noise {kind!r}"
        if not isinstance(pair, Mapping):
            raise _fail(src, where, None, "expected {sigma: ..., nu: ...}")
        extra = set(pair) - set(_NOISE_PARAMS)
        if extra:
            raise _fail(src, where, sorted(extra)[0], f"unknown key(s) {sorted(extra)}; "
                        f"expected {list(_NOISE_PARAMS)}")
        noise[str(kind)] = {}
        for p in _NOISE_PARAMS:
            if p not in pair:
                raise _fail(src, where, p, "missing")
            noise[str(kind)][p] = _check_dist(pair[p], src, f"{where} {p!r}",
                                              allowed=_POSITIVE_SUPPORT)
    for kind in REQUIRED_NOISE_KINDS:
        if kind not in noise:
            raise _fail(src, f"noise {kind!r}", "noise", "missing observation kind")

    content = {"schema_version": SCHEMA_VERSION, "terms": parsed_terms, "gpu_overrides": overrides,
               "hierarchy": hierarchy, "ard": ard, "noise": noise}
    return PriorSet(path=src, terms=parsed_terms, gpu_overrides=overrides, hierarchy=hierarchy,
                    ard=ard, noise=noise, schema_version=SCHEMA_VERSION,
                    _hash=_canonical_hash(content))


def load_priors(path: str | Path | Mapping[str, Any] | None = None,
                terms: Sequence[str] = DEFAULT_TERMS,
                alpha_terms: Sequence[str] = ALPHA_TERMS) -> PriorSet:
    """Load and validate a prior file.

    Parameters
    ----------
    path : str, Path, Mapping or None
        YAML file; ``None`` = the repository's ``priors/default.yaml``; a mapping is validated as
        already-parsed content.
    terms : sequence of str
        Term set whose priors are required (default :data:`~bayes_latency.physics.basis.DEFAULT_TERMS`).
    alpha_terms : sequence of str
        Alpha terms whose priors are required.

    Returns
    -------
    PriorSet

    Raises
    ------
    PriorError
        Missing/unreadable file or invalid content; the message names file, term and field.
    """
    if isinstance(path, Mapping):
        return parse_priors(path, "<dict>", terms, alpha_terms)
    p = Path(path) if path is not None else DEFAULT_PRIORS_PATH
    refuse_special(p, "prior file", PriorError, folders_ok=False)
    if not p.is_file():
        raise PriorError(f"{p}: prior file not found")
    try:
        raw = load_yaml(read_text(p, "prior file", PriorError))
    except (OSError, yaml.YAMLError) as e:
        raise PriorError(f"{p}: cannot read prior file: {e}") from None
    return parse_priors(raw, str(p), [getattr(t, "name", t) for t in terms],
                        [getattr(a, "name", a) for a in alpha_terms])


__all__ = ["DEFAULT_PRIORS_PATH", "DISTRIBUTIONS", "HIERARCHY_EFFECTS", "PriorSet",
           "REQUIRED_NOISE_KINDS", "SCHEMA_VERSION", "load_priors", "parse_priors"]
