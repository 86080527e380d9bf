"""Which seed a test gets: the session default and the per-test derivation.

Apart from :mod:`._determinism` because it needs no torch: the plugin names the default seed
when it registers ``--precision-seed``, long before (and often without) any test seeding.
"""

from __future__ import annotations

import hashlib

DEFAULT_SEED = 1234


def derive_seed(session_seed: int, name: str) -> int:
    """A seed for ``name`` (a test's node id) that depends only on the two arguments.

    A cryptographic digest, not ``hash()``: string hashing is salted per process, and the value
    must be the same in every xdist worker and in every run.
    """
    digest = hashlib.sha256(f"{session_seed}\0{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big")
