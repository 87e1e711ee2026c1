"""Interleaved trials and the commands built on them: compare, bench, ladder, sweep-batch, tune."""
