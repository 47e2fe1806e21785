"""The flowy conformance suite against standalone Redis and a Redis Cluster."""

from flowy.testing.suite import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary]
