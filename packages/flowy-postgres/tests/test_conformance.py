"""The whole flowy conformance suite against PostgreSQL (one schema per test)."""

from flowy.testing.suite import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary]
