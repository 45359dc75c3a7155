"""``bayes-latency export``: the command that writes one configuration's coefficients to a file.

:func:`export_command` validates its arguments (:func:`check_export_args`, before anything is
loaded), loads the posterior and writes the JSON document or the BLIS YAML built by
:mod:`bayes_latency.export.document`, refusing non-finite numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xarray as xr

from bayes_latency.errors import BayesLatencyError
from bayes_latency.export.document import (
    _check_finite,
    blis_yaml,
    export_document,
    export_notes,
    provenance,
    step_noise_of,
)
from bayes_latency.textfiles import load_yaml

MAX_EXPORT_DRAWS = 100_000
"""Upper bound of ``export --draws`` (each draw is a full coefficient vector in the output)."""


def check_export_args(args: argparse.Namespace) -> None:
    """Validate ``export`` arguments before loading anything (same rules for every format).

    ``--tp`` not given is :func:`default_tp` (1 when the weights fit one GPU, printed; an error
    naming the option otherwise). ``--tp`` must be a positive integer that divides the model's attention heads and whose KV
    heads divide evenly (or are replicated: ``tp`` a multiple of the KV heads); ``--draws`` in
    ``[0, MAX_EXPORT_DRAWS]``.

    Raises
    ------
    BayesLatencyError
        Naming the option (``ConfigError`` / ``UnknownArchitectureError`` for the model).
    """
    from bayes_latency.errors import ConfigError
    from bayes_latency.physics.models import load_architecture

    draws = getattr(args, "draws", 0)
    if draws is None:
        draws = 0
    if isinstance(draws, bool) or not isinstance(draws, int) or not 0 <= draws <= MAX_EXPORT_DRAWS:
        raise BayesLatencyError(f"--draws {draws!r}: must be an integer in "
                                f"[0, {MAX_EXPORT_DRAWS:,}]")
    arch = load_architecture(args.model)
    if getattr(args, "tp", None) is None:
        args.tp = default_tp(arch, args.gpu)
    tp = args.tp
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"--tp {tp!r}: must be a positive integer")
    if arch.attention != "mla":
        if arch.n_heads % tp:
            raise ConfigError(f"--tp {tp} does not divide the {arch.n_heads} attention heads "
                              f"of {arch.name!r}")
        if arch.n_kv_heads % tp and tp % arch.n_kv_heads:
            raise ConfigError(f"--tp {tp} neither divides nor is a multiple of the "
                              f"{arch.n_kv_heads} KV heads of {arch.name!r}")
    elif tp > arch.n_heads or arch.n_heads % tp:
        raise ConfigError(f"--tp {tp} does not divide the {arch.n_heads} attention heads of "
                          f"{arch.name!r}")


def default_tp(arch: object, gpu: str) -> int:
    """The TP degree of ``export`` without ``--tp``: 1 when the model's weights fit one GPU (with
    room for a KV cache), said on stdout; otherwise the option is required.

    Raises
    ------
    ConfigError
        The weights of ``arch`` do not fit one ``gpu``: ``--tp`` must be given.
    """
    from bayes_latency.errors import ConfigError
    from bayes_latency.physics.capacity import kv_capacity_tokens
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.serving import ServingConfig

    g = load_gpu(gpu)
    if kv_capacity_tokens(arch, g, ServingConfig(tp=1)) > 0:
        print(f"--tp not given: TP 1 (the weights of {arch.name} fit one {g.name})")
        return 1
    gib = arch.params_total * arch.weight_bytes / 2**30
    raise ConfigError(f"--tp is required for {arch.name} on {g.name}: its weights ({gib:.0f} GiB) "
                      f"do not fit one GPU ({g.memory_bytes / 2**30:.0f} GiB); give the TP degree "
                      "it is served with")


def export_command(args: argparse.Namespace) -> int:
    """``bayes-latency export [posterior.nc | --population P] --model M --gpu G --tp N
    [--draws N] --format json|blis --out FILE``: writes the JSON document or the BLIS YAML of
    the configuration; returns 0. Without a posterior it is a zero-shot export from a fleet
    population (:func:`population_export`)."""
    from bayes_latency.checks.sanity import load_posterior
    from bayes_latency.io import check_output_path

    if args.posterior is not None and getattr(args, "population", None) is not None:
        raise BayesLatencyError("give a posterior file or --population, not both (a posterior "
                                "exports its fit; --population a zero-shot export)")
    check_export_args(args)
    if args.posterior is None:
        return population_export(args)
    inputs = [Path(args.posterior)] + [Path(p) for p in (args.model, args.gpu,
                                                         getattr(args, "priors", None),
                                                         getattr(args, "workload", None))
                                       if p and Path(p).exists()]
    out = check_output_path(args.out, inputs, kind="file")
    workload = workload_stages(args)
    model = load_posterior(args.posterior, priors=getattr(args, "priors", None))

    def draws() -> tuple[xr.Dataset, dict, list[str] | None, dict | None]:
        # the export is for simulating a run of the configuration: a new one
        coefs = model.coefficients(args.model, args.gpu, int(args.tp), new_run=True)
        noise = step_noise_of(model, coefs)
        origin = None
        if workload is not None:
            from bayes_latency.export.origin import config_notes

            origin = config_notes(coefs)
            coefs, more = project_workload(coefs, workload, args)
            origin += more
        return coefs, provenance(model.result.attrs, args.posterior), origin, noise

    return _write_export(args, out, args.posterior, draws)


def population_export(args: argparse.Namespace) -> int:
    """``bayes-latency export [--population P] --model M --gpu G --tp N ...``: the zero-shot
    export of a configuration from a fleet population alone
    (:meth:`~bayes_latency.model.posterior.fleet.Population.coefficients`; default the shipped
    population), whose notes name every level the population did not see and what informed the
    others (:func:`~bayes_latency.export.origin.population_notes`). Returns 0."""
    from bayes_latency.export.document import file_sha256
    from bayes_latency.export.origin import population_notes
    from bayes_latency.io import check_output_path
    from bayes_latency.model.posterior.population_file import SHIPPED_POPULATION, load_population
    from bayes_latency.physics.hardware import load_gpu

    spec = getattr(args, "population", None)
    if spec is not None and str(spec).lower() == "none":
        raise BayesLatencyError("--population none: a zero-shot export needs a population (omit "
                                "--population for the shipped one)")
    if getattr(args, "priors", None):
        raise BayesLatencyError("--priors checks a posterior's embedded priors; a population "
                                "file carries its own (drop --priors)")
    load_gpu(args.gpu)  # an unknown GPU is the option's error, not the population's
    path = Path(spec) if spec is not None else SHIPPED_POPULATION
    inputs = [path] + [Path(p) for p in (args.model, args.gpu, getattr(args, "workload", None))
                       if p and Path(p).exists()]
    out = check_output_path(args.out, inputs, kind="file")
    workload = workload_stages(args)
    pop = load_population(path)

    def draws() -> tuple[xr.Dataset, dict, list[str] | None, dict | None]:
        coefs = pop.coefficients(args.model, args.gpu, int(args.tp))
        prov = {**provenance(pop.attrs), "population": pop.name,
                "population_file": path.name, "population_sha256": file_sha256(path)}
        notes = population_notes(pop.describe(), coefs)
        if workload is not None:
            coefs, more = project_workload(coefs, workload, args)
            notes = list(notes or []) + more
        return coefs, prov, notes, None

    return _write_export(args, out, path, draws, zero_shot=True)


@dataclasses.dataclass(frozen=True)
class Workload:
    """The load stages of ``--workload`` and the notes on how they were read."""

    stages: list
    notes: list[str]


def workload_stages(args: argparse.Namespace) -> Workload | None:
    """The load stages of ``--workload``, or None without the option; read and checked before
    any posterior is loaded.

    ``--workload`` is a client result (read as ``calibrate`` reads it: the load the client
    sent, with its measured means) or a workload spec (an inference-perf profile or a BLIS
    workload spec with an ``inference_perf`` section,
    :func:`~bayes_latency.data.client.lifecycle.read_workload_spec`: the load asked for). A
    client result's prompts default to each user's whole prompt cached, a spec's to the system
    prompt only (how BLIS expands it); ``--prompt-sharing`` overrides either.

    Raises
    ------
    BayesLatencyError
        The file is missing or unreadable, or its runs cannot be replayed (naming the file).
    """
    spec = getattr(args, "workload", None)
    if spec is None:
        return None
    from bayes_latency.calibrate.stages import (
        check_client_report,
        client_stages,
        default_kv_blocks,
        spec_stages,
    )
    from bayes_latency.data.client.lifecycle import read_workload_spec, workload_spec_fields
    from bayes_latency.data.client.read import read_client_results
    from bayes_latency.textfiles import refuse_special

    path = Path(spec)
    refuse_special(path, "--workload (client result or workload spec)", BayesLatencyError)
    if not path.exists():
        raise BayesLatencyError(f"--workload {path}: no such file or folder")
    for opt, name in (("--kv-blocks", "kv_blocks"), ("--max-num-seqs", "max_num_seqs"),
                      ("--max-num-batched-tokens", "max_num_batched_tokens")):
        v = getattr(args, name, None)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise BayesLatencyError(f"{opt} {v!r}: must be a positive integer")
    kv = int(args.kv_blocks) if getattr(args, "kv_blocks", None) else default_kv_blocks(
        args.model, args.gpu, int(args.tp))
    server = dict(max_num_seqs=int(getattr(args, "max_num_seqs", 128) or 128),
                  max_num_batched_tokens=int(getattr(args, "max_num_batched_tokens", 2048)
                                             or 2048))
    sharing = getattr(args, "prompt_sharing", None)
    notes: list[str] = []
    is_spec, doc = _yaml_workload_spec(path)
    if is_spec:
        # a document that did not parse is read again by the reader, whose error names it
        fields = read_workload_spec(path) if doc is None else workload_spec_fields(doc, path)
        stages = spec_stages(fields, args.model, args.gpu, int(args.tp), kv, name="spec",
                             prompt_sharing=sharing or "system", notes=notes, **server)
        notes.insert(0, f"--workload {path.name}: {fields['format']}; every stage replayed as "
                        "open-loop Poisson arrivals at its rate"
                        + ("; BLIS expands enable_multi_turn_chat as closed-loop sessions whose "
                           "offered load is below the rate, so its batches run smaller than "
                           "this operating point's" if fields.get("multi_turn") else ""))
        return Workload(stages, notes)
    tables, report = read_client_results(path)
    check_client_report(report, path)
    stages = client_stages(tables, args.model, args.gpu, int(args.tp), kv, path=path,
                           notes=notes, **server)
    return Workload([dataclasses.replace(st, prompt_sharing=sharing or "prompt")
                     for st in stages], notes)


def _yaml_workload_spec(path: Path) -> tuple[bool, object]:
    """Whether ``path`` is read as a workload spec (a YAML file that is not a TraceV2 header,
    the one YAML client result), and its parsed document (None when it does not parse)."""
    import yaml

    from bayes_latency.textfiles import TextEncodingError, load_yaml, read_text

    if not path.is_file() or path.suffix.lower() not in (".yaml", ".yml"):
        return False, None
    try:
        doc = load_yaml(read_text(path))
    except (OSError, TextEncodingError, yaml.YAMLError):
        return True, None
    return not (isinstance(doc, dict) and "trace_version" in doc), doc


def project_workload(coefs: xr.Dataset, workload: Workload, args: argparse.Namespace
                     ) -> tuple[xr.Dataset, list[str]]:
    """Replay the ``workload``'s stages at the posterior-mean coefficients of ``coefs`` (the
    package's scheduler, :func:`~bayes_latency.schedule.replay.replay_stage`) and project the
    coefficients onto BLIS's basis over the replayed steps
    (:func:`~bayes_latency.export.projection.project_onto_blis`); returns the projected
    coefficients and the notes naming the operating point, how the workload was read and the
    projection's error there."""
    from bayes_latency.export.projection import project_over_stages

    stages = workload.stages
    rates = [f"{r:.3g}" for r in sorted({st.arrival_rate for st in stages}) if np.isfinite(r)]
    sharing = {"prompt": "each user's whole prompt cached",
               "system": "only the system prompt shared"}[stages[0].prompt_sharing]
    where = (f"--workload {Path(args.workload).name} ({len(stages)} load stage(s)"
             + (f", {', '.join(rates)} req/s" if rates else "") + f", {sharing}, replayed by the "
             "package's scheduler at the posterior-mean coefficients)")
    proj, _ = project_over_stages(coefs, stages, args.model, args.gpu, where)
    return proj.coefs, [f"operating point: {where}"] + workload.notes + proj.notes


def _write_export(args: argparse.Namespace, out: Path, source: str | Path,
                  draws: Callable[[], tuple[xr.Dataset, dict, list[str] | None, dict | None]],
                  zero_shot: bool = False) -> int:
    """Render the configuration's export in ``args.format`` from ``draws()`` (coefficients,
    provenance, notes on where they come from or None, step noise or None), refuse non-finite
    numbers naming ``source`` (the posterior or population file), write it atomically to
    ``out`` and print its notes. Returns 0."""
    from bayes_latency.io import atomic_write_text

    config = {"model": args.model, "gpu": args.gpu, "tp": int(args.tp)}
    n_draws = int(getattr(args, "draws", 0) or 0)
    try:
        with np.errstate(all="ignore"):  # a non-finite result is refused by _check_finite
            coefs, prov, origin, step_noise = draws()
            if args.format == "blis":
                text = blis_yaml(coefs, config, prov, n_draws=n_draws, origin_notes=origin,
                                 source="population" if zero_shot else "posterior")
                _check_finite(load_yaml(text))
            elif args.format == "json":
                doc = export_document(coefs, config, prov, n_draws=n_draws,
                                      step_noise=step_noise, origin_notes=origin)
                _check_finite(doc)
                text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
            else:
                raise BayesLatencyError(f"unknown export format {args.format!r} (json or blis)")
    except BayesLatencyError as exc:  # name the file the bad coefficients come from
        if str(source) in str(exc):
            raise
        raise type(exc)(f"{source}: {exc}") from exc
    atomic_write_text(out, text)
    for note in export_notes(coefs, config, origin):
        print(f"note: {note}")
    print(f"wrote {'zero-shot ' if zero_shot else ''}{args.format} export of {args.model} on "
          f"{args.gpu} tp{args.tp} to {out}")
    return 0
