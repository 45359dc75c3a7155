"""What a fit knows besides its draws, as one frozen bundle for the modules that need it.

:class:`FitState` holds the priors, the design (coefficients, terms, configurations), the model
configuration (method, variant, sampler), the noise per (configuration, noise class), the stage-1
summaries, the identifiability report and the data hash. The functional modules of the model
(:mod:`bayes_latency.model.posterior.deterministics`, :mod:`bayes_latency.model.posterior.groups`, :mod:`bayes_latency.model.posterior.persistence`, :mod:`bayes_latency.model.posterior.predict`) take it instead
of the estimator; :class:`~bayes_latency.model.estimator.LatencyModel` makes one from its
attributes when it calls them.

Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bayes_latency.model.definition.likelihood import DEFAULT_NOISE_LOAD

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.model.definition.design import Design
    from bayes_latency.model.definition.identifiability import IdentifiabilityReport
    from bayes_latency.model.definition.likelihood import NoiseParams
    from bayes_latency.model.definition.summaries import ConfigSummary
    from bayes_latency.model.posterior.shifts import RunTable


@dataclass(frozen=True)
class FitState:
    """The fitted state shared by the model's functional modules (see module docstring).

    ``noise`` maps configuration id to noise class to :class:`~bayes_latency.model.definition.likelihood.NoiseParams`
    (stage 1's estimates on the fast path, posterior means on the full path; empty before they
    are known). ``summaries`` are the stage-1 summaries (fast path, after a fit; None after a
    load).
    """

    priors: Any
    design: Design
    method: str
    variant: str
    sampler: str
    noise: Mapping[str, Mapping[str, NoiseParams]]
    summaries: Sequence[ConfigSummary] | None = None
    identifiability: IdentifiabilityReport | None = None
    data_hash: str | None = None
    noise_load: str = DEFAULT_NOISE_LOAD
    #: the fitted runs' and windows' shifts (None: no run effects)
    runs: RunTable | None = None

    @property
    def coefs(self) -> tuple[str, ...]:
        """Beta terms then alpha terms."""
        return tuple(self.design.coefs)

    @property
    def terms(self) -> tuple[str, ...]:
        """The beta terms."""
        return tuple(self.design.beta_terms)

    @property
    def alpha_terms(self) -> tuple[str, ...]:
        """The alpha terms."""
        return tuple(self.design.alpha_terms)
