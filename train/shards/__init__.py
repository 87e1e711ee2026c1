"""The dataset side: what a built dataset is (spec), where it comes from (catalog of sources), the
record format's two halves (convert writes records, records reads them back) and integrity checks.

Built datasets live in shards/ at the top of the checkout (git-ignored); train/sources.py registers
the built-in sources, and is where a forker adds one.
"""
