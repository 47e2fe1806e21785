"""The whole conformance suite against the embedded SQLite backend."""

from flowy.testing.suite import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary]
