"""Where an :class:`~bayes_latency.physics.architecture.Architecture` comes from.

:func:`load_architecture` accepts a known short name (shipped as trimmed JSON configs in
``physics/data/models/``), one of its aliases (e.g. ``meta-llama/Llama-2-70b-hf``), a path to a
``config.json`` (or a folder holding one), or an already parsed dict; the parsing itself is
:func:`bayes_latency.physics.hf_config.architecture_from_config`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from bayes_latency.errors import UnknownArchitectureError
from bayes_latency.physics.architecture import Architecture
from bayes_latency.physics.hf_config import architecture_from_config
from bayes_latency.textfiles import read_text, refuse_special

__all__ = ["MODELS_DIR", "known_architectures", "load_architecture", "resolve_name"]

MODELS_DIR = Path(__file__).resolve().parent / "data" / "models"
"""Directory of the shipped (trimmed) model configs, one ``<short-name>.json`` each."""

# Short name -> extra aliases (the short name itself, the file stem, and any "org/name" whose
# last component matches are always accepted; comparison is case-insensitive).
_ALIASES: dict[str, tuple[str, ...]] = {
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", "Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf",
                   "llama2-7b", "llama-2-7b-chat"),
    "llama-2-70b": ("meta-llama/Llama-2-70b-hf", "Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf",
                    "llama2-70b", "llama-2-70b-chat"),
    "codellama-34b": ("codellama/CodeLlama-34b-Instruct-hf", "CodeLlama-34b-Instruct-hf",
                      "codellama/CodeLlama-34b-hf", "codellama-34b-instruct", "codellama-34b-instruct-hf"),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", "Mixtral-8x7B-v0.1",
                     "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-instruct"),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B",
                     "meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct", "llama3.1-8b"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B",
                      "meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b-instruct",
                      "llama3.1-70b"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B", "qwen2.5-7b-instruct"),
    "bloom-176b": ("bigscience/bloom", "bloom", "bloom176b"),
    "yi-34b": ("01-ai/Yi-34B", "01-ai/Yi-34B-Chat", "yi-34b-chat"),
    "qwen3-14b": ("Qwen/Qwen3-14B",),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Instruct-2507"),
    "mistral-nemo-12b": ("mistralai/Mistral-Nemo-Instruct-2407", "mistralai/Mistral-Nemo-Base-2407",
                         "mistral-nemo-instruct-2407", "mistral-nemo"),
    "deepseek-v2-lite": ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite-Chat"),
    "llama-4-scout-17b-16e-fp8": ("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic",
                                  "Llama-4-Scout-17B-16E-Instruct-FP8-dynamic",
                                  "llama-4-scout-17b-16e-instruct-fp8-dynamic", "llama-4-scout-fp8"),
}



def _norm(s: str) -> str:
    return s.strip().lower()


@lru_cache(maxsize=1)
def _alias_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for p in sorted(MODELS_DIR.glob("*.json")):
        table[_norm(p.stem)] = p.stem
    for short, aliases in _ALIASES.items():
        table[_norm(short)] = short
        for a in aliases:
            table[_norm(a)] = short
            table[_norm(a.split("/")[-1])] = short
    return table


def known_architectures() -> list[str]:
    """Short names of the shipped model configs."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def resolve_name(name: str) -> str | None:
    """Short name of a shipped model for ``name`` (alias, ``org/name``, any case), or None."""
    table = _alias_table()
    key = _norm(name)
    if key in table:
        return table[key]
    last = key.split("/")[-1]
    return table.get(last)


@lru_cache(maxsize=64)
def _load_shipped(short: str) -> Architecture:
    path = MODELS_DIR / f"{short}.json"
    cfg = json.loads(read_text(path, "config.json", UnknownArchitectureError))
    return architecture_from_config(cfg, name=short, source=str(path))


def load_architecture(name_or_path: str | Path | Mapping[str, Any] | Architecture) -> Architecture:
    """Resolve a model to its :class:`Architecture`.

    Parameters
    ----------
    name_or_path : str, Path, Mapping or Architecture
        A known short name or alias (case-insensitive; e.g. ``llama-2-70b``,
        ``meta-llama/Llama-2-70b-hf``), a path to a Hugging Face ``config.json`` (or a directory
        holding one), a parsed config dict, or an ``Architecture`` (returned unchanged).

    Returns
    -------
    Architecture

    Raises
    ------
    UnknownArchitectureError
        Unknown name (the message lists the known ones) or malformed config (names file and field).
    """
    if isinstance(name_or_path, Architecture):
        return name_or_path
    if isinstance(name_or_path, Mapping):
        cfg = name_or_path
        nm = str(cfg.get("_name_or_path") or cfg.get("name") or "custom")
        return architecture_from_config(cfg, name=nm)
    s = str(name_or_path)
    short = resolve_name(s)
    if short is not None and (MODELS_DIR / f"{short}.json").is_file():
        return _load_shipped(short)
    p = Path(s).expanduser()
    if p.is_dir() and os.path.lexists(p / "config.json"):
        p = p / "config.json"
    refuse_special(p, "config.json", UnknownArchitectureError)
    if p.is_file():
        try:
            cfg = json.loads(read_text(p, "config.json", UnknownArchitectureError))
        except (OSError, json.JSONDecodeError) as e:
            raise UnknownArchitectureError(f"{p}: cannot read config.json: {e}") from None
        nm = p.parent.name if p.name == "config.json" else p.stem
        return architecture_from_config(cfg, name=nm, source=str(p))
    raise UnknownArchitectureError(
        f"unknown model {s!r}: not a known name and not a config.json path; "
        f"known: {', '.join(known_architectures())}")
