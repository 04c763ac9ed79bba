"""Tiny package used to test launching workers with `python -m` (see envmod)."""
