"""``bayes-latency calibrate``: a client benchmark result replayed and fitted until its means
stop moving.

:func:`calibrate_command` validates every argument and output path before the long work, reads
the client result, calibrates (:func:`~bayes_latency.calibrate.loop.calibrate`), saves the
posterior atomically, prints the history, the replayed means against the measured ones and the
gates, and with ``--export`` writes the BLIS YAML (run-level draws; a regime posterior's compute
knees projected onto BLIS's basis over the calibrated stages)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bayes_latency.errors import BayesLatencyError


def calibrate_command(args: argparse.Namespace) -> int:
    """``bayes-latency calibrate RESULT --model M --gpu G --tp N --out post.nc``.

    Reads a client benchmark result (any format :func:`~bayes_latency.data.client.read.
    read_client_results` accepts), builds its load stages, calibrates (replay -> fit -> replay at
    the posterior mean until the client means stop moving; with ``--tables`` the ingested trace
    rows join the same fit), saves the posterior atomically, prints the history, the replayed
    means against the measured ones and the gates, and with ``--export`` writes a BLIS YAML whose
    ``draws`` are run-level draws (:func:`~bayes_latency.calibrate.loop.run_level_coefficients`).
    Exit 1 when a convergence or adequacy gate fails, the calibration did not converge or a
    measured client mean is outside its run-level 90% band (the model cannot explain it, e.g.
    trace rows of ``--tables`` that disagree with the client result).
    """
    import json
    import math

    import pandas as pd

    from bayes_latency.cli.fit import _check_sampler_args
    from bayes_latency.io import atomic_path, atomic_write_text, check_output_path
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture

    # ---- validation before any long work
    _check_sampler_args(args)
    for opt, name, lo in (("--tp", "tp", 1), ("--max-num-seqs", "max_num_seqs", 1),
                          ("--max-num-batched-tokens", "max_num_batched_tokens", 1),
                          ("--max-iter", "max_iter", 1), ("--export-draws", "export_draws", 0),
                          ("--fast-iter", "fast_iter", 0)):
        v = getattr(args, name)
        if v is not None and v < lo:
            raise BayesLatencyError(f"{opt} {v}: must be >= {lo}")
    if args.kv_blocks is not None and args.kv_blocks < 1:
        raise BayesLatencyError(f"--kv-blocks {args.kv_blocks}: must be >= 1")
    if not (0 < args.tol < 1):
        raise BayesLatencyError(f"--tol {args.tol}: must be in (0, 1)")
    from bayes_latency.cli.export import MAX_EXPORT_DRAWS

    if args.export_draws is not None and args.export_draws > MAX_EXPORT_DRAWS:
        raise BayesLatencyError(f"--export-draws {args.export_draws}: must be an integer in "
                                f"[0, {MAX_EXPORT_DRAWS:,}] (each draw is a full coefficient "
                                f"vector in the export)")
    from bayes_latency.textfiles import refuse_special

    result = Path(args.result)
    refuse_special(result, "RESULT (client result)", BayesLatencyError)
    if not result.exists():
        raise BayesLatencyError(f"RESULT {result}: no such file or folder")
    from bayes_latency.cli.fit import table_inputs

    inputs = [result] + table_inputs(args.tables) \
        + [Path(p) for p in (args.model, args.gpu, args.priors, args.population)
           if p and Path(p).exists()]
    out_path = check_output_path(args.out, inputs, kind="file")
    export_path = check_output_path(args.export, inputs + [out_path], kind="file",
                                    option="--export") if args.export else None
    if export_path is not None and export_path.resolve() == out_path.resolve():
        raise BayesLatencyError(f"--export {export_path}: the same file as --out")
    arch = load_architecture(args.model)
    gpu = load_gpu(args.gpu)
    if arch.n_heads % args.tp:
        raise BayesLatencyError(f"--tp {args.tp}: does not divide the {arch.n_heads} attention "
                                f"heads of {arch.name}")
    from bayes_latency.cli.fit import parse_terms

    terms = parse_terms(args.terms)
    pop = _calibrate_population(args, terms)

    # ---- inputs
    from bayes_latency.calibrate.stages import (
        check_client_report,
        client_stages,
        default_kv_blocks,
        stages_table,
    )
    from bayes_latency.data.client.read import read_client_results

    tables, report = read_client_results(result)
    print(report.format())
    check_client_report(report, result)
    kv = int(args.kv_blocks) if args.kv_blocks else default_kv_blocks(args.model, args.gpu,
                                                                      args.tp)
    stage_notes: list[str] = []
    stages = client_stages(tables, args.model, args.gpu, args.tp, kv, path=result,
                           max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed,
                           notes=stage_notes)
    for note in stage_notes:
        print(f"note: {note}")
    print(f"{len(stages)} load stage(s) to replay on {arch.name} / {gpu.name} / TP {args.tp}, "
          f"{kv} KV blocks per GPU" + ("" if args.kv_blocks else " (BLIS's formula)"))
    with pd.option_context("display.width", 140, "display.max_columns", 20):
        print(stages_table(stages).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    base = pd.DataFrame()
    if args.tables:
        from bayes_latency.data.tables import check_tables, load_checked_observations

        check_tables(args.tables)
        base = load_checked_observations(args.tables)
        print(f"--tables: {len(base):,} trace / benchmark rows join the fit")

    # ---- calibrate
    from bayes_latency.calibrate.loop import calibrate, client_predictions, ttft_alpha_share
    from bayes_latency.model.estimator import LatencyModel
    from bayes_latency.physics.basis import DEFAULT_TERMS, replay_terms

    def fit(obs: pd.DataFrame) -> object:
        m = LatencyModel(priors=args.priors, terms=terms or DEFAULT_TERMS, method=args.method,
                         sampler=args.sampler, population=pop)
        # sampling goes on while the gates fail, as `fit` does (the sum-only terms' ridge: bulk
        # ESS 283 at 2000 draws on a real Mixtral result under the population; R-hat 1.013 and
        # ESS 376 on a synthetic result under the roofline priors alone)
        return m.fit(obs, draws=args.draws, tune=args.tune, chains=args.chains, seed=args.seed,
                     progress=sys.stderr.isatty(), target_accept=args.target_accept,
                     max_draws="auto")

    def fast_fit(obs: pd.DataFrame) -> object:   # while the rows move: posterior means only
        m = LatencyModel(priors=args.priors, terms=terms or DEFAULT_TERMS, method=args.method,
                         sampler=args.sampler, population=pop)
        return m.fit(obs, draws=max(args.draws // 4, 100), tune=max(args.tune // 4, 100),
                     chains=args.chains, seed=args.seed, progress=sys.stderr.isatty(),
                     target_accept=args.target_accept, max_draws=None)

    start = None
    if pop is not None:
        from bayes_latency.calibrate.loop import population_start

        start = population_start(pop, stages, replay_terms(terms or DEFAULT_TERMS))
    cal = calibrate(base, stages, fit, terms=replay_terms(terms or DEFAULT_TERMS), start=start,
                    tol=args.tol, max_iter=args.max_iter,
                    seed=args.seed,
                    fast_fit=fast_fit if args.fast_iter else None,
                    max_fast_iter=max(args.fast_iter, 1))
    m = cal.model
    with atomic_path(out_path) as tmp:
        m.save(tmp)
    h = cal.history
    print(f"calibration: {cal.iterations} iteration(s), final change of a client mean "
          f"{cal.final_change:.2%} (tolerance {args.tol:.2%}), "
          + ("converged" if cal.converged else "NOT converged"))
    print(h[["iteration", "fit", "fit_s", "replay_s", "max_change", "worst_row", "damping"]]
          .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    pred = client_predictions(m, stages, cal.replays, replay_terms(terms or DEFAULT_TERMS),
                              n_draws=200, seed=args.seed)
    share = ttft_alpha_share(m, args.model, args.gpu, int(args.tp),
                             pred.loc[pred["kind"] == "workload_ttft", "mean_us"].to_numpy())
    # one set of run-level draws for the printed bands and the export
    run = _run_level_draws(m, args, share)
    pred = pred.merge(_bands(run, stages, cal.replays, replay_terms(terms or DEFAULT_TERMS)),
                      on=["experiment_id", "kind"], how="left")
    show = pred[["experiment_id", "kind", "observed_us", "mean_us", "q05_us", "q95_us",
                 "run_q05_us", "run_q95_us", "error"]]
    print("replayed client means at the posterior (µs; q05/q95: 5-95% over coefficient draws; "
          "run_q05/run_q95: a new run's mean, run-level draws):")
    print(show.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    sig = run.attrs.get("run_level_sigma", {})
    print("run-to-run scatter of the bands (log scale): "
          + ", ".join(f"{k} {v:.3f}" for k, v in sig.items())
          + f" [{run.attrs.get('run_level_sigma_source', 'fitted')}]")
    print(f"saved {out_path}")

    # ---- export with run-level draws
    if export_path is not None:
        import yaml

        from bayes_latency.export.document import (
            _check_finite,
            blis_draws,
            blis_yaml,
            export_notes,
            provenance,
        )
        from bayes_latency.export.origin import calibration_notes

        config = {"model": args.model, "gpu": args.gpu, "tp": int(args.tp)}
        coefs = m.coefficients(args.model, args.gpu, int(args.tp))
        prov = {**provenance(m.result.attrs, out_path), "client_result": str(result),
                "calibration_iterations": int(cal.iterations),
                "calibration_final_change": float(cal.final_change)}
        pop_attrs = json.loads(m.result.attrs["population"]) \
            if "population" in m.result.attrs else None
        extra = calibration_notes(pop_attrs, cal.unfitted)
        coefs, run, more = _project_knees(coefs, run, stages, args)
        extra += more
        text = blis_yaml(coefs, config, prov, extra_notes=extra)
        if args.export_draws:
            sig = run.attrs.get("run_level_sigma", {})
            text += yaml.safe_dump(
                {"draws_kind": "run-level: posterior draws x the run-to-run scatter of the client "
                               "means (predictive band of a new run's mean)",
                 "run_level_sigma": {k: float(v) for k, v in sig.items()},
                 "run_level_sigma_source": str(run.attrs.get("run_level_sigma_source")),
                 "ttft_alpha_share": float(share),
                 "draws": blis_draws(run, int(args.export_draws), args.seed, config)},
                sort_keys=False, default_flow_style=None, width=120)
        from bayes_latency.textfiles import load_yaml

        _check_finite(load_yaml(text))
        atomic_write_text(export_path, text)
        for note in export_notes(coefs, config) + extra:
            print(f"note: {note}")
        print(f"exported {export_path}" + (f" with {args.export_draws} run-level draws"
                                           if args.export_draws else ""))

    # ---- gates
    from bayes_latency.checks.adequacy import check_fit

    conv = m.convergence({"max_rhat": args.max_rhat})
    print(f"max R-hat {conv['max_rhat']:.4f}, min bulk ESS {conv['min_ess_bulk']:.0f}, "
          f"divergences {conv['divergences']}" + (" [APPROXIMATE: no MCMC diagnostics]"
                                                  if conv["approximate"] else ""))
    adq, _, _ = check_fit(m, cal.observations, None, seed=args.seed)
    failed = []
    if not conv["passed"]:
        failed.append("convergence: " + "; ".join(conv["failures"]))
    if not adq.passed:
        failed.append("adequacy: " + "; ".join(adq.failures))
    if not cal.converged:
        failed.append(f"calibration: the client means still moved by {cal.final_change:.2%} "
                      f"after {cal.iterations} iteration(s) (raise --max-iter)")
    fitted = pred[(pred["kind"] != "workload_decode") & pred["observed_us"].notna()]
    worst = float(fitted["error"].abs().max()) if len(fitted) else math.nan
    print(f"largest error of a replayed client mean: {worst:.2%}")
    out_band = fitted[(fitted["observed_us"] < fitted["run_q05_us"])
                      | (fitted["observed_us"] > fitted["run_q95_us"])]
    if len(out_band):
        failed.append("client means outside the run-level 90% band: " + "; ".join(
            f"{r.experiment_id} {r.kind} measured {r.observed_us / 1e3:.4g} ms, band "
            f"[{r.run_q05_us / 1e3:.4g}, {r.run_q95_us / 1e3:.4g}] ms"
            for r in out_band.itertuples()))
    if failed:
        print("bayes-latency: gates failed:\n" + "\n".join(f"- {f}" for f in failed),
              file=sys.stderr)
        return 1
    print("gates passed (convergence, adequacy, calibration, client means in their bands)")
    return 0


def _calibrate_population(args: argparse.Namespace, terms: tuple[str, ...] | None) -> object:
    """The population ``calibrate`` fits under: ``--population`` (a file, or ``none``), else the
    shipped real-fleet population unless ``--tables`` or ``--priors`` is given (None: the
    roofline priors alone). Printed."""
    from bayes_latency.model.posterior.population_file import resolve_population

    if args.population is None and (args.tables or args.priors):
        return None
    pop = resolve_population(args.population)
    if pop is None:
        print("prior: the roofline priors alone (--population none)")
        return None
    if terms is not None and tuple(terms) != tuple(pop.terms):
        raise BayesLatencyError(f"--terms {','.join(terms)}: the population {pop.name!r} has "
                                f"terms {','.join(pop.terms)}; give those, or --population none")
    print(f"prior: the fleet population {pop.name!r} ({len(pop.configs)} configurations, terms "
          f"{', '.join(pop.terms)})")
    return pop


def _run_level_draws(m: object, args: argparse.Namespace, share: float) -> object:
    """Run-level coefficient draws (:func:`~bayes_latency.calibrate.loop.run_level_coefficients`),
    with ``run_level_sigma_source`` as one readable line (the scatter of each client kind is
    pooled over the fit's configurations and the prior, see
    :func:`~bayes_latency.calibrate.loop.run_level_sigma`: one or two client means of a
    configuration cannot estimate it on their own); ``share``: the alphas' share of the mean
    TTFT (:func:`~bayes_latency.calibrate.loop.ttft_alpha_share`)."""
    from bayes_latency.calibrate.loop import run_level_coefficients

    run = run_level_coefficients(m, args.model, args.gpu, int(args.tp), seed=args.seed,
                                 ttft_alpha_share=share)
    src = run.attrs.get("run_level_sigma_source", {})
    run.attrs["run_level_sigma_source"] = ", ".join(f"{k}: {v}" for k, v in src.items())
    return run


def _project_knees(coefs: object, run: object, stages: list, args: argparse.Namespace
                   ) -> tuple[object, object, list[str]]:
    """A calibrated regime fit's coefficients and run-level draws projected onto BLIS's basis over
    the steps of the calibrated result itself (:mod:`bayes_latency.export.projection`), with the
    notes; unchanged, without notes, for a fit without knee terms."""
    from bayes_latency.export.projection import KNEE_TERMS, project_over_stages

    if not {str(t) for t in coefs["term"].values} & set(KNEE_TERMS):
        return coefs, run, []
    where = f"the calibrated result ({len(stages)} load stage(s), replayed at the posterior mean)"
    proj, (run,) = project_over_stages(coefs, stages, args.model, args.gpu, where,
                                       seed=args.seed, draws=(run,))
    return proj.coefs, run, proj.notes


def _bands(run: object, stages: list, replays: dict, terms: tuple[str, ...]) -> object:
    """5-95% band of each stage's replayed client means over the run-level draws (µs); ``terms``:
    those of the replays' features."""
    import numpy as np
    import pandas as pd

    from bayes_latency.calibrate.loop import draw_matrices
    from bayes_latency.schedule.replay import WORKLOAD_KINDS

    B, A = draw_matrices(run, terms)
    rows = []
    for s in stages:
        rep = replays[s.experiment_id]
        for k in WORKLOAD_KINDS[:2]:
            v = B @ rep.features[k] + sum(w * A.get(a, 0.0) for a, w in rep.alpha[k].items())
            rows.append({"experiment_id": s.experiment_id, "kind": k,
                         "run_q05_us": float(np.quantile(v, 0.05)),
                         "run_q95_us": float(np.quantile(v, 0.95))})
    return pd.DataFrame(rows)
