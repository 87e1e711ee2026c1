"""Fuzzing: many randomly damaged shards and configs.

Whatever the damage: the run ends within a bounded time, with either success or a clear
error (exit status 2, a message and no traceback), and no half-written output is left.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import NO_PROFILE, ROOT, TINY_MODEL, data_sets, run_cli, set_args
from train import config
from train.core.errors import UserError

SHARD_CASES = 8
CONFIG_CASES = 300


def damage_randomly(path: Path, rng: np.random.Generator) -> str:
    data = bytearray(path.read_bytes())
    kind = rng.choice(["truncate", "flip", "zeros", "append", "empty", "shuffle_block"])
    if kind == "truncate":
        data = data[: int(rng.integers(1, len(data)))]
    elif kind == "flip":
        for position in rng.integers(0, len(data), int(rng.integers(1, 9))):
            data[position] ^= 1 << int(rng.integers(0, 8))
    elif kind == "zeros":
        start = int(rng.integers(0, len(data) - 1))
        end = min(len(data), start + int(rng.integers(1, 512)))
        data[start:end] = bytes(end - start)
    elif kind == "append":
        data += rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    elif kind == "empty":
        data = bytearray()
    else:
        start = int(rng.integers(0, len(data) - 64))
        block = data[start : start + 64]
        data[start : start + 64] = bytes(reversed(block))
    path.write_bytes(bytes(data))
    return str(kind)


# Each case starts a CLI process: the fast tests run case 1 (zeroed bytes, naive preset); the flipped and
# truncated shards of cases 0 and 2 are what test_reliability's damaged-shard tests check in this process.
SLOW_SHARD_CASES = {0}  # make test; the others: make test-long (tests/test_reliability.py damages shards fast)


def _tier(case: int) -> list:
    return [pytest.mark.slow] if case in SLOW_SHARD_CASES else [pytest.mark.long]


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, marks=_tier(case)) for case in range(SHARD_CASES)],
)
def test_randomly_damaged_shards_fail_clearly_in_bounded_time(tiny_data_dir, tmp_path, case):
    rng = np.random.default_rng([2026, case])
    copy = tmp_path / "data"
    shutil.copytree(tiny_data_dir, copy)
    shards = sorted(p for p in copy.rglob("*.tfrecord-*"))
    victim = shards[int(rng.integers(len(shards)))]
    kind = damage_randomly(victim, rng)
    preset = "naive" if case % 2 else "optimized"
    runs = tmp_path / "runs"
    sets = data_sets(copy) + NO_PROFILE + TINY_MODEL + [f"runs_dir={runs}", "train.epochs=1", "pipeline.batch_size=16"]
    result = run_cli("fit", "--config", f"configs/{preset}.yaml", *set_args(sets), timeout=180)
    assert result.returncode in (0, 2), (kind, result.stderr[-3000:])
    if result.returncode == 2:
        assert "Traceback" not in result.stderr, (kind, result.stderr[-3000:])
        message = result.stderr.strip().splitlines()[-1]
        assert message.startswith("error: ") and victim.name in message, (kind, message)
    run_dir = runs / preset
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name], kind
    if (run_dir / "summary.json").exists():
        json.loads((run_dir / "summary.json").read_text())


def mutate(values: dict, rng: np.random.Generator) -> dict:
    """One random change: a typo'd key, a wrong type, an out-of-range value, a stray section..."""
    values = json.loads(json.dumps(values))
    sections = [k for k, v in values.items() if isinstance(v, dict)]
    section = str(rng.choice(sections))
    keys = list(values[section])
    key = str(rng.choice(keys)) if keys else "x"
    junk = [0, -1, -7.5, 10**12, "", "auto", "grpc://", "nonsense", True, None, [1, 2], {"a": 1}, 1e-12, "0"]
    action = rng.integers(0, 6)
    if action == 0:
        values[section][key[:-1] + "_" if len(key) > 1 else "_"] = values[section].pop(key, None)
    elif action == 1:
        values[section][key] = junk[int(rng.integers(len(junk)))]
    elif action == 2:
        values[str(rng.choice(["trian", "pipline", "extra", "data"]))] = junk[int(rng.integers(len(junk)))]
    elif action == 3:
        values[section] = junk[int(rng.integers(len(junk)))]
    elif action == 4:
        values["model"] = {
            "name": str(rng.choice(["tiny", "resnet", "vit", ""])),
            key: junk[int(rng.integers(len(junk)))],
        }
    else:
        values[section].pop(key, None)
    return values


@pytest.mark.slow
def test_random_configs_are_accepted_or_rejected_with_a_message(tmp_path):
    rng = np.random.default_rng(7)
    base = {name: config.to_dict(config.load(ROOT / f"configs/{name}.yaml")) for name in ("naive", "optimized")}
    outcomes = {"accepted": 0, "rejected": 0}
    for case in range(CONFIG_CASES):
        values = mutate(base[str(rng.choice(list(base)))], rng)
        path = tmp_path / f"case{case}.yaml"
        path.write_text(yaml.safe_dump(values))
        try:
            config.load(path)
            outcomes["accepted"] += 1
        except UserError as error:
            assert str(error) and "\n" not in str(error), str(error)
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > CONFIG_CASES // 2 and outcomes["accepted"] > 0, outcomes


def test_a_few_random_configs_through_the_command_line(tmp_path):
    rng = np.random.default_rng(11)
    base = config.to_dict(config.load(ROOT / "configs/optimized.yaml"))
    for case in range(3):
        values = mutate(base, rng)
        values["data"] = {**base["data"], "data_dir": str(tmp_path / "nothing-built")}  # never trains
        path = tmp_path / f"cli{case}.yaml"
        path.write_text(yaml.safe_dump(values))
        result = run_cli("fit", "--config", str(path), timeout=120)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1].startswith("error: ")
