"""The whole conformance suite against the toy store of ``toy.py``."""

# pyright resolves flowy through the environment, as a library, where strict mode refuses a
# star import; importing every suite class is the point of this module.
# pyright: reportWildcardImportFromLibrary=false

from flowy.testing.suite import *  # noqa: F403
