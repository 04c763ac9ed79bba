"""A `torch` that cannot be imported: on PYTHONPATH it stands for an interpreter without torch
(the `--preflight` skip test), whatever the machine's python3 has installed."""

raise ImportError("no torch in this interpreter (test stand-in)")
