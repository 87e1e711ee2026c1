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
