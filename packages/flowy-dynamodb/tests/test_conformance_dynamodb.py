"""The flowy conformance suite against DynamoDB (fixture ``flowy_url`` in conftest)."""

from flowy.testing.suite import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary]
