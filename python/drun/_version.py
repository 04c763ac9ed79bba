"""The version of drun: the helper module and the ``drun`` binaries ship together in one wheel.

Kept equal to ``[workspace.package] version`` in the root ``Cargo.toml`` (the binaries' and the
wheel's version); ``tests/packaging.rs`` fails when the two differ.
"""

__version__ = "0.1.0"
