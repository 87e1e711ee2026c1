"""`bench-check --pool` (train/benchmarks/check_pool.py): earlier runs' A/A rounds pooled, and whether each pairing
centres within 1 % of 1.00, from check.json files as bench-check writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli


def _check_run(folder: Path, cpu: str, pairings: dict) -> Path:
    """A bench-check report (check.json) as `make bench-check` writes it, with the given per-round A/A ratios."""
    import statistics as st

    aa = {name: {"ratios": ratios, "median": st.median(ratios)} for name, ratios in pairings.items()}
    report = {"cpu": {"model": cpu, "bf16_units": True}, "scenarios": {"auto": {"aa": aa, "order": {}}}}
    folder.mkdir(parents=True)
    (folder / "check.json").write_text(json.dumps(report))
    return folder


def test_bench_check_pool_says_whether_each_pairing_centres_within_one_percent(tmp_path):
    """Three runs' rounds pooled: one pairing at 1.00 and quiet (yes), one 5 % off in every run (no), one 2-3 % either
    way from run to run (cannot tell); through the command, as a user runs it."""
    quiet = [[1.001, 0.999, 1.0], [1.0, 1.002, 0.998], [0.999, 1.001, 1.0]]
    biased = [[1.05, 1.052, 1.048], [1.049, 1.051, 1.05], [1.05, 1.047, 1.053]]
    noisy = [[0.97, 0.98, 0.99], [1.0, 1.02, 1.03], [1.01, 0.96, 1.04]]
    folders = [
        _check_run(tmp_path / f"run{i}", "Xeon", {"bench": quiet[i], "ladder": biased[i], "tune": noisy[i]})
        for i in range(3)
    ]
    result = run_cli("bench-check", "--pool", *map(str, folders), "--out", str(tmp_path / "pooled"))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {row["pairing"]: row for row in json.loads((tmp_path / "pooled" / "pooled.json").read_text())["rows"]}
    assert {name: row["centred_within_1pct"] for name, row in rows.items()} == {
        "bench": "yes",
        "ladder": "no",
        "tune": "cannot tell",
    }
    assert rows["ladder"]["rounds"] == 9 and rows["ladder"]["median"] == 1.05
    low, high = rows["tune"]["interval"]
    assert low < 0.99 < high and low <= rows["tune"]["median"] <= high
    assert "| auto | ladder | x1.050, x1.050, x1.050 | 9 | x1.050 |" in (tmp_path / "pooled" / "pooled.md").read_text()


def test_bench_check_pool_refuses_what_it_cannot_pool(tmp_path):
    from train.benchmarks import check_pool
    from train.core.errors import UserError

    one = _check_run(tmp_path / "a", "Xeon", {"bench": [1.0, 1.0, 1.0]})
    other = _check_run(tmp_path / "b", "EPYC", {"bench": [1.0, 1.0, 1.0]})
    with pytest.raises(UserError, match="2 machine kinds .*EPYC"):
        check_pool.read_runs([one, other])
    with pytest.raises(UserError, match=r"nowhere/check.json does not exist"):
        check_pool.read_runs([tmp_path / "nowhere"])
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "check.json").write_text('{"scenarios": {"auto": {"aa": {"bench": {}}}}}')
    with pytest.raises(UserError, match=r"c/check.json is not a bench-check report .*ratios"):
        check_pool.read_runs([tmp_path / "c"])
    result = run_cli("bench-check", "--pool", str(one), "--trials", "3")
    assert result.returncode == 2 and "--trials does not apply" in result.stderr, result.stderr
