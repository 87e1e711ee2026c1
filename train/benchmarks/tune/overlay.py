"""The overlay tune writes (configs/tuned.yaml): only the changed knobs, under a header that says where,
on what and by how much, and the command that trains with it."""

from __future__ import annotations

import datetime
import json
import shlex
from pathlib import Path

import yaml

from train import workloads
from train.core import files
from train.core.errors import UserError

_MISSING = object()


def per_s(result: dict) -> str:
    """The unit of the rates, short (the workload's: ex/s for images, tokens/s for text)."""
    return workloads.of_record(result).unit.short


def flatten(values: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, dotted))
        else:
            flat[dotted] = value
    return flat


def nest(flat: dict) -> dict:
    nested: dict = {}
    for key, value in flat.items():
        node = nested
        *sections, leaf = key.split(".")
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return nested


def as_sets(state: dict) -> list[str]:
    """--set strings for a state (values as YAML scalars)."""
    return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in state.items()]


def overlay(best: dict, base: dict) -> dict:
    """The knobs of `best` whose value differs from the config tune started from (without any
    earlier tuned overlay), nested as a YAML overlay."""
    return nest({key: value for key, value in best.items() if base.get(key, _MISSING) != value})


def read_tuned(path: Path) -> tuple[dict, str]:
    """The knobs of an earlier configs/tuned.yaml (flattened) and its header's first lines."""
    try:
        text = path.read_text()
        values = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"Cannot read {path} ({error}). Fix or delete it, or pass --fresh.") from None
    if not isinstance(values, dict):
        raise UserError(f"{path} must hold a mapping (an overlay). Fix or delete it, or pass --fresh.")
    header = [line[2:] for line in text.splitlines() if line.startswith("# ")][:4]
    return flatten(values), " / ".join(header)


def tuned_header(result: dict) -> str:
    final = result["final"]
    lines = [
        f"Written by `make tune` (python -m train tune) on {result.get('date', datetime.date.today().isoformat())}.",
        f"machine: {result.get('machine', '?')}",
        f"dataset: {result.get('dataset', '?')}",
        f"scenario: {result.get('scenario', '?')}",
        f"config: {result.get('config', '?')}",
    ]
    if final:
        lines += [
            f"start {final['start_rate']:,.0f} {per_s(result)}, tuned {final['tuned_rate']:,.0f} "
            f"{per_s(result)} (medians of the final "
            f"check, {result['final_rounds']} interleaved rounds)",
            f"gain x{final['gain']:.3f} (median of per-round ratios; quartiles {final['q1']:.3f}-{final['q3']:.3f}, "
            f"min-max {final['min']:.3f}-{final['max']:.3f}; A/A noise {final['noise']:.3f})",
        ]
    else:
        lines.append(result["note"])
    changed = flatten(result["overlay"] or {})
    for key in result.get("changes_learning", ()):
        if key in changed:
            lines.append(f"{key} {changed[key]} with train.learning_rate scaled linearly: this changes what is learned")
    lines += [
        f"Only the knobs that changed. Use: {train_command(result)}",
        "(tuned for the scenario above: under another model or machine, run make tune again).",
    ]
    return "".join(f"# {line}\n" for line in lines)


def train_command(result: dict) -> str:
    """The command that trains what was tuned: the same config, scenario, overlays and --set, with the
    tuned overlay; a --set whose key the overlay holds is left out (it would override the tuned value).
    `make train-optimized` where the config is a workload's optimized preset, `python -m train fit` otherwise."""
    tuned = set(flatten(result.get("overlay") or {}))
    layers = [*result.get("scenario_overlays", []), *result.get("user_overlays", []), result["tuned_path"]]
    sets = [item for item in result.get("overrides", []) if item.split("=", 1)[0] not in tuned]
    arguments = [f"--overlay {shlex.quote(str(layer))}" for layer in layers]
    arguments += [f"--set {shlex.quote(item)}" for item in sets]
    workload = workloads.of_record(result)
    config = result.get("config_path", workload.presets.optimized)
    if files.project_file(config).resolve() == files.project_file(workload.presets.optimized).resolve():
        return f'make train-optimized{workload.make_args} ARGS="' + " ".join(arguments) + '"'
    return " ".join(["python -m train fit --config", shlex.quote(str(config)), *arguments])
