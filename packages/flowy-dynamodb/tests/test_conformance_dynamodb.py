"""The flowy conformance suite against DynamoDB (fixture ``flowy_url`` in conftest).

The lease and visibility expiry tests run with ``short_ttl = 1.0`` s rather than 0.3 s:
every call here is an HTTP round trip into an emulator's Python request parser (tens of
milliseconds at the median, over 300 ms at the tail on a loaded machine), so a 0.3 s
lease can run out between two consecutive calls of one test. The contracts are the same.
"""

from flowy.testing import suite
from flowy.testing.suite import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary, reportAssignmentType]


class LeaseSuite(suite.LeaseSuite):
    short_ttl = 1.0


class FencingSuite(suite.FencingSuite):
    short_ttl = 1.0


class OutboxSuite(suite.OutboxSuite):
    short_ttl = 1.0
