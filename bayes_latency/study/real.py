"""The real-data study: fit, cross-validate and compare the hierarchy on published measurements.

Data: read from ``../shared/data/real`` (never copied), as described in
:mod:`bayes_latency.study.realdata`.

What :func:`main` does:

1. builds one pooled observation table of all of it (Splitwise rows form configurations of their
   own, ``model|gpu|tpN|splitwise``, and the hierarchy adds a ``stack`` level);
2. analyses which coefficients the rows identify (:func:`identifiability_table`, with the default
   11 terms and with :data:`REAL_TERMS`);
3. fits :class:`LatencyModel` with :data:`REAL_TERMS` on all data and, separately, on the real
   H100 iterations only; reports convergence and per-term posteriors (``coefficients.csv``,
   ``coefficients_h100.csv``, forest);
4. cross-validates over held-out experiments, a held-out TP degree and a held-out GPU x TP cell;
5. runs three baselines on the same splits (per-experiment linear blackbox, non-pooled NNLS on
   our basis, BLIS's published ``trained-physics`` coefficients);
6. compares the observed mean decode interval per token of the 16 runs with predicted mean
   iteration times;
7. writes ``README.md``, CSV tables and PNG figures to the output folder.

Times are in microseconds (µs) unless a column says otherwise (``_ms``).

Where each part lives:

- :mod:`~bayes_latency.study.settings`: ``REAL_TERMS``, sampler settings, methods, fit labels;
- :mod:`~bayes_latency.study.realdata`: locating the data, :class:`RealData`,
  :func:`load_real_data`, :func:`h100_serving`, the cross-validation splits;
- :mod:`~bayes_latency.study.baselines`: blackbox, NNLS and BLIS-published baselines;
- :mod:`~bayes_latency.study.cv`: fits of ours, posterior summaries, :func:`run_cv`, metrics;
- :mod:`~bayes_latency.study.workload`: the workload table and the typical-batch step;
- :mod:`~bayes_latency.study.markdown` and :mod:`~bayes_latency.study.report`: README and plots.

This module keeps :func:`main` (the orchestration) and re-exports the public names.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from bayes_latency.physics.basis import DEFAULT_TERMS
from bayes_latency.study.baselines import (
    BLIS_ALPHA,
    BLIS_BETA,
    baseline_predictions,
    blackbox_design,
    blis_published_beta,
    fit_blackbox,
    fit_nnls,
)
from bayes_latency.study.cv import (
    _log_fit,
    coefficient_table,
    error_metrics,
    fit_ours,
    identifiability_table,
    insample_table,
    ours_predictions,
    run_cv,
    stack_effect,
    worst_rhat,
)
from bayes_latency.study.real_exports import write_real_exports
from bayes_latency.study.realdata import (
    H100_GPU,
    H100_SERVING,
    RealData,
    Split,
    define_splits,
    h100_serving,
    load_real_data,
    real_data_dir,
)
from bayes_latency.study.report import COMMAND, _plots, write_readme
from bayes_latency.study.settings import (
    FULL,
    FULL_CV,
    FULL_H100,
    H100_FIT,
    H100_FIT_DEFAULT,
    METHOD_LABELS,
    METHODS,
    N_PRED_DRAWS,
    QUICK,
    REAL_TERMS,
    SEED,
    FitSettings,
)
from bayes_latency.study.workload import typical_step, workload_table

__all__ = [
    "BLIS_ALPHA",
    "BLIS_BETA",
    "COMMAND",
    "FULL",
    "FULL_CV",
    "FULL_H100",
    "FitSettings",
    "H100_FIT",
    "H100_FIT_DEFAULT",
    "H100_GPU",
    "H100_SERVING",
    "METHODS",
    "METHOD_LABELS",
    "N_PRED_DRAWS",
    "QUICK",
    "REAL_TERMS",
    "RealData",
    "SEED",
    "Split",
    "baseline_predictions",
    "blackbox_design",
    "blis_published_beta",
    "coefficient_table",
    "define_splits",
    "error_metrics",
    "fit_blackbox",
    "fit_nnls",
    "fit_ours",
    "h100_serving",
    "identifiability_table",
    "insample_table",
    "load_real_data",
    "main",
    "ours_predictions",
    "real_data_dir",
    "run_cv",
    "stack_effect",
    "typical_step",
    "workload_table",
    "worst_rhat",
    "write_readme",
]

# --------------------------------------------------------------------------------- main
CONV_COLUMNS = ["fit", "n_rows", "n_configs", "max_rhat", "min_ess_bulk", "divergences", "passed",
                "runtime_s", "failures", "hints"]


def main(out: Path, quick: bool = False) -> int:
    """Run the real-data study and write its results to ``out``.

    Parameters
    ----------
    out
        Output folder (created; files in it are overwritten).
    quick
        Two CV splits and 200 draws / 200 tuning steps per fit (for tests).

    Returns
    -------
    int
        0 on success, and also when the real data is absent (a message says so and nothing is
        written).
    """
    t0 = time.perf_counter()
    data_dir = real_data_dir()
    if data_dir is None:
        print("[study] real data not found (set $BAYES_LATENCY_REAL_DATA or place it at "
              "../shared/data/real): nothing to do")
        return 0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = QUICK if quick else FULL
    h100_settings = QUICK if quick else FULL_H100
    cv_settings = QUICK if quick else FULL_CV
    data = load_real_data(data_dir)
    obs = data.observations
    print(f"[study] {data.notes[0]}")
    ident, ident_every = identifiability_table(obs)
    ident.to_csv(out / "identifiability.csv", index=False)
    print("[study] fitting all data")
    model, conv = fit_ours(obs, settings)
    conv["fit"] = "all data"
    _log_fit(conv)
    coefs = coefficient_table(model, obs)
    coefs.to_csv(out / "coefficients.csv", index=False, float_format="%.6g")
    insample = insample_table(model, obs)
    insample.to_csv(out / "insample.csv", index=False, float_format="%.4g")
    exports = write_real_exports(model, out / "exports")
    print(f"[study] BLIS exports of the real runs' configurations: {len(exports)} files in "
          f"{out / 'exports'}")
    rhat = worst_rhat(model)
    stack_eff = stack_effect(model)
    fit_notes = list(model.report.notes)
    print("[study] fitting the H100 iterations only")
    obs_h100 = obs[obs["source"] == "steps"].reset_index(drop=True)
    model_h100, conv_h100 = fit_ours(obs_h100, h100_settings)
    conv_h100["fit"] = H100_FIT
    _log_fit(conv_h100)
    coefs_h100 = coefficient_table(model_h100, obs_h100)
    coefs_h100 = coefs_h100[coefs_h100["block"] == "beta"].reset_index(drop=True)
    coefs_h100.to_csv(out / "coefficients_h100.csv", index=False, float_format="%.6g")
    insample_h100 = insample_table(model_h100, obs_h100)
    rhat_h100 = worst_rhat(model_h100, k=3)
    del model_h100
    print("[study] fitting the H100 iterations only with the 11 default terms (for comparison)")
    _, conv_h100_default = fit_ours(obs_h100, h100_settings, terms=DEFAULT_TERMS)
    conv_h100_default["fit"] = H100_FIT_DEFAULT
    _log_fit(conv_h100_default)
    splits = define_splits(obs, quick=quick)
    cv, heldout, convs, cv_models = run_cv(data, splits, cv_settings)
    conv_df = pd.DataFrame([conv, conv_h100, conv_h100_default] + convs)[CONV_COLUMNS]
    conv_df.assign(failures=conv_df["failures"].map("; ".join),
                   hints=conv_df["hints"].map("; ".join)).to_csv(
        out / "convergence.csv", index=False, float_format="%.4g")
    cv.to_csv(out / "cv.csv", index=False, float_format="%.4g")
    print("[study] workload level")
    workload = workload_table(data, model, cv_models, splits)
    workload.to_csv(out / "workload.csv", index=False, float_format="%.5g")
    files = _plots(out, model, heldout, cv)
    runtime = time.perf_counter() - t0
    write_readme(out, data=data, settings=settings, cv_settings=cv_settings,
                 h100_settings=h100_settings, quick=quick,
                 conv=conv_df, coefs=coefs, cv=cv, workload=workload, splits=splits, files=files,
                 runtime_s=runtime, insample=insample, rhat=rhat, fit_notes=fit_notes,
                 ident=ident, ident_every=ident_every, coefs_h100=coefs_h100,
                 insample_h100=insample_h100, rhat_h100=rhat_h100, stack_eff=stack_eff)
    print(f"[study] wrote {out} in {runtime:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("results/real"),
                  quick="--quick" in sys.argv))
