"""The whole conformance suite against the in-memory reference backends."""

from flowy.testing.suite import *  # noqa: F403
