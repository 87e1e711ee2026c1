"""`make tune`: the fastest settings of the speed knobs for your data on your machine.

Starting from a config (the optimized preset by default, plus configs/tuned.yaml when a previous
tune wrote one), a greedy coordinate search tries one knob at a time over a short list of
candidates, most promising first (each knob's first choice, then the second ones), each
measured against the current best and kept only when faster beyond the noise (the benchmarks'
one rule, train/benchmarks/stats.py). Its parts:

    space.py    what is searched: the knobs that change speed and not what is learned
    search.py   the greedy search loop
    measure.py  the measuring adapter: each candidate in its own process (isolated.py)
    command.py  the final check, the outputs, the overlay written only when tuned is faster
    overlay.py  configs/tuned.yaml: the changed knobs, its header, the command that trains with it
    report.py   tune.md, tune.png, the printed summary
    cli.py      options in, everything wired together (`main`)
"""


def main(opts) -> int:
    """Run `make tune` with TuneOptions (imported here so that the search's parts load without TensorFlow)."""
    from train.benchmarks.tune import cli

    return cli.main(opts)
