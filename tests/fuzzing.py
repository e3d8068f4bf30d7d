"""Hypothesis settings shared by the fuzz tests.

In CI the examples are a fixed (derandomized) set, small enough that every fuzz
test together takes well under a minute. ``KVSTORE_FUZZ_EXAMPLES=N`` runs N
random examples per test instead (the long form, e.g. N = 2000)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_LONG = os.environ.get("KVSTORE_FUZZ_EXAMPLES")
EXAMPLES = int(_LONG) if _LONG else 60

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=_LONG is None,
                database=None, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
#: For tests whose every example waits on a deadline.
FUZZ_FEW = settings(FUZZ, max_examples=max(5, EXAMPLES // 10))
