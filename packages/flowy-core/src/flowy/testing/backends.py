"""Helpers for adapter fixtures that look for a real backend server.

Fixtures find a backend in this order: an explicit URL from the environment; a server on
its default local port; a container started with testcontainers when a Docker engine
answers; (DynamoDB) moto's server mode. When none is found the test is skipped with the
reason, unless ``FLOWY_REQUIRE_BACKENDS=1`` is set, in which case it fails.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
from typing import Any, NoReturn

import pytest

__all__ = ["backend_missing", "docker_available", "port_open", "require_backends"]


def require_backends() -> bool:
    """True when ``FLOWY_REQUIRE_BACKENDS=1``: a missing backend fails instead of skipping."""
    return os.environ.get("FLOWY_REQUIRE_BACKENDS", "") not in ("", "0", "false", "no")


def backend_missing(reason: str) -> NoReturn:
    """Skip (or, with ``FLOWY_REQUIRE_BACKENDS=1``, fail) the current test."""
    if require_backends():
        pytest.fail(f"{reason} (FLOWY_REQUIRE_BACKENDS=1, so this is a failure)")
    pytest.skip(reason)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a TCP connection to ``host:port`` succeeds within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def docker_available() -> bool:
    """True if a Docker engine answers (so testcontainers can start containers)."""
    try:
        docker: Any = importlib.import_module("docker")  # a testcontainers dependency
    except ImportError:
        return False
    client: Any = None
    try:
        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means no usable Docker engine
        return False
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
