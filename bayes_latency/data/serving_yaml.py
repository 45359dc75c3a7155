"""The serving YAML of an experiment: reading, defaults, validation, and the checks of a trace
against it.

Serving YAML (``serving.yaml``)
-------------------------------
A flat mapping::

    experiment_id: llama-2-7b-h100-tp1-general   # default: folder name (or file stem)
    model: llama-2-7b        # known short name / HF name, or a config.json path (relative to the YAML)
    gpu: H100                # GPU name, or a datasheet YAML path (relative to the YAML)
    tp: 1
    workload: general        # free label (default: "")
    max_num_batched_tokens: 2048
    max_num_seqs: 128
    max_model_len: 4096
    block_size: 16
    prefix_caching: true     # and any other ServingConfig knob (vLLM names accepted)

Knobs may also sit under a nested ``serving:`` mapping. inference-perf's ``exp-config.yaml``
(``model``, ``tensor_parallelism``, ``max_num_batched_tokens``, ``max_num_seqs``,
``max_model_len``) is accepted too, with an added ``gpu`` key.

Every knob is validated when the file is read (:func:`load_serving_yaml`), so an error names
the YAML and the field before any trace is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bayes_latency.data.jsonl import _replace_lone_surrogates
from bayes_latency.errors import ConfigError
from bayes_latency.textfiles import load_yaml, read_text

__all__ = ["SOURCE_KEY", "load_serving_yaml", "serving_config"]

_CONFIG_NAMES = ("serving.yaml", "serving.yml", "exp-config.yaml")

#: Key of a :func:`load_serving_yaml` dict holding the file it was read from (for messages).
SOURCE_KEY = "_source"


def load_serving_yaml(path: str | Path) -> dict[str, Any]:
    """Read a serving YAML (or an inference-perf ``exp-config.yaml`` plus a ``gpu`` key).

    Parameters
    ----------
    path
        The YAML file (format in the module docstring).

    Returns
    -------
    dict
        A flat mapping with ``experiment_id`` (default: the folder name for ``serving.yaml`` /
        ``exp-config.yaml``, else the file stem), ``model`` and ``gpu`` (paths relative to the
        YAML made absolute), ``tp`` (int, default 1), ``workload`` (default ``""``) and the
        serving knobs as given (feed it to :func:`serving_config`).

    Raises
    ------
    ConfigError
        Unreadable file, not a mapping, or missing / invalid ``model`` or ``gpu`` (named).
    """
    path = Path(path)
    try:
        doc = load_yaml(read_text(path, "serving config", ConfigError))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read serving config: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: serving config must be a mapping")
    return _normalise(doc, path)


def _normalise(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Flatten, default and resolve the fields of a serving mapping read from ``path``."""
    doc, _ = _replace_lone_surrogates(doc)  # "\ud800" escapes: no Parquet writer takes them
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if k == "serving" and isinstance(v, dict):
            out.update(v)
        else:
            out[str(k)] = v
    if "tensor_parallelism" in out and "tp" not in out:
        out["tp"] = out.pop("tensor_parallelism")
    out.setdefault("tp", 1)
    for key in ("model", "gpu"):
        val = out.get(key)
        if not isinstance(val, str) or not val.strip():
            raise ConfigError(f"{path}: field {key!r} is missing or not a string "
                              f"(a known name or a path relative to the YAML)")
        cand = path.parent / val
        if cand.is_file():
            out[key] = str(cand.resolve())
    if not out.get("experiment_id"):
        out["experiment_id"] = (path.parent.name if path.name in _CONFIG_NAMES
                                and path.parent.name else path.stem)
    out["experiment_id"] = str(out["experiment_id"])
    out["workload"] = str(out.get("workload") or "")
    out.setdefault(SOURCE_KEY, str(path))
    serving_config(out, source=out[SOURCE_KEY])  # knob errors name the YAML, before any work
    return out


def serving_config(cfg: dict[str, Any], source: str | None = None) -> Any:
    """:class:`~bayes_latency.physics.serving.ServingConfig` of a :func:`load_serving_yaml` dict
    (errors name ``source``, else the serving YAML the dict was read from)."""
    from bayes_latency.physics.serving import ServingConfig

    return ServingConfig.from_dict(cfg, source=source or cfg.get(SOURCE_KEY))


def _given(cfg: dict[str, Any], knob: str) -> bool:
    """Whether the serving mapping sets ``knob`` (vLLM's spellings accepted)."""
    return any(str(k).strip().lstrip("-").replace("-", "_") == knob for k in cfg)


def _cfg_source(cfg: dict[str, Any], trace: Path) -> str:
    """The file a serving mapping came from (for messages), else the trace."""
    return str(cfg.get(SOURCE_KEY) or trace)


def _check_prompt_lengths(requests: pd.DataFrame, serving: Any, cfg: dict[str, Any],
                          source: str) -> None:
    """vLLM rejects prompts longer than ``max_model_len``: seeing any means the config is wrong.

    Raises
    ------
    ConfigError
        Naming the serving file and ``max_model_len`` when a request's prompt exceeds it.
    """
    if not len(requests) or "prompt_tokens" not in requests:
        return
    prompt = requests["prompt_tokens"].to_numpy(dtype=float, na_value=np.nan)
    given = _given(cfg, "max_model_len")
    limit = getattr(serving, "max_model_len", None)
    if not given or not limit:  # only a value the user gave can be contradicted
        return
    over = prompt > limit
    if over.any():
        raise ConfigError(f"{source}: serving config field 'max_model_len' = {limit} is smaller than the prompts "
                          f"of {int(over.sum())} request(s) in the trace (largest "
                          f"{int(np.nanmax(prompt))} tokens); fix max_model_len")
