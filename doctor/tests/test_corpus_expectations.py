"""How the corpus record is compared (tests/corpus_expectations.py), on diagnoses written here: no profile, so it
runs with the fast tests, where the corpus module (tests/test_diagnose_corpus.py) does not."""

from tests import corpus_expectations, records


def test_a_planted_cause_tied_with_the_first_counts_as_first_and_one_behind_does_not():
    def item(*ranked):
        return records.run("input-bound", [records.recommendation(c, g) for c, g in ranked])

    tied = item(("heavy-map", 1.21), ("sequential-file-reads", 1.20), ("small-batch", 1.07))
    assert corpus_expectations.first_or_tied(tied, ["sequential-file-reads"]) == ("sequential-file-reads", 1.20)
    behind = item(("heavy-map", 1.30), ("sequential-file-reads", 1.20))
    assert corpus_expectations.first_or_tied(behind, ["sequential-file-reads"]) == ("heavy-map", 1.30)
    expected = {"verdicts": ["input-bound"], "first": "sequential-file-reads", "gain_of": "sequential-file-reads"}
    assert not corpus_expectations.mismatches({**expected, "gain": [1.1, 2.0]}, tied)
    assert corpus_expectations.mismatches({**expected, "gain": [1.1, 2.0]}, behind)


def test_a_cache_above_the_planted_stage_counts_as_naming_it_and_one_beside_it_does_not():
    """many_files_sequential: a cache after the parse removes the reads under it (prove: x7.0, parallel reads x1.2)."""
    at = "Iterator::Root::Prefetch::MapAndBatch"
    reads = records.recommendation("sequential-file-reads", 1.44, stage=at + "::ForeverRepeat::FlatMap")

    def first(cause, stage, estimates):
        ranked = [records.recommendation(cause, 4.8, stage=stage, estimates=estimates), reads]
        return records.run("input-bound", ranked)

    above = first("heavy-map", at, {"cache": 4.8})
    assert corpus_expectations.first_or_tied(above, ["sequential-file-reads"]) == ("sequential-file-reads", 1.44)
    decoded = first("decode-every-epoch", at, None)
    assert corpus_expectations.first_or_tied(decoded, ["sequential-file-reads"])[0] == "sequential-file-reads"
    spread = first("heavy-map", at, {"parallel-calls": 4.8})  # no cache: the reads stay
    assert corpus_expectations.first_or_tied(spread, ["sequential-file-reads"]) == ("heavy-map", 4.8)
    parallel = first("sequential-map", at, {"parallel-calls": 4.8, "cache": 2.0})  # it gains by parallel calls
    assert corpus_expectations.first_or_tied(parallel, ["sequential-file-reads"]) == ("sequential-map", 4.8)
    beside = first("heavy-map", "Iterator::Root::Prefetch::Zip", {"cache": 4.8})
    assert corpus_expectations.first_or_tied(beside, ["sequential-file-reads"]) == ("heavy-map", 4.8)
