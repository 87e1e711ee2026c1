"""tests/run_both.py: the two products' tests side by side or in turn, and the exit status of the pair."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.run_both import NONE_SELECTED, status


def test_the_first_failure_is_the_status_and_a_product_with_no_test_selected_fails_only_alone():
    assert status([0, 0]) == 0
    assert status([1, 0]) == 1 and status([0, 2]) == 2 and status([1, 2]) == 1
    assert status([0, NONE_SELECTED]) == 0 and status([NONE_SELECTED, 1]) == 1
    assert status([NONE_SELECTED, NONE_SELECTED]) == NONE_SELECTED


@pytest.mark.slow
@pytest.mark.parametrize(  # two pytest sessions each: make test runs the pair side by side, make test-long in turn too
    "in_turn", [pytest.param([], id="side_by_side"), pytest.param(["--in-turn"], id="in_turn", marks=pytest.mark.long)]
)
def test_a_k_that_names_a_test_of_one_product_runs_it_there_and_passes(in_turn):
    only = "test_tiny_data_constants_match_the_fixture"  # the template's alone
    done = subprocess.run(
        [sys.executable, "tests/run_both.py", *in_turn, "not long", "-q", "-p", "no:cacheprovider", "-k", only],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summaries = [line for line in done.stdout.splitlines() if " deselected in " in line]
    assert len(summaries) == 2 and ["1 passed" in line for line in summaries].count(True) == 1, done.stdout
