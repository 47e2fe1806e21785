"""The ``flowy`` command: inspect, resume and serve threads of any store, and the demo.

``main()`` is the console entry point; ``flowy.cli.demo`` holds the demo's refund agent
(an ordinary module: ``flowy worker --graph flowy.cli.demo:build_graph`` loads it).
"""

from __future__ import annotations

from ._main import main as main

__all__ = ["main"]
