"""What the flowy-langgraph tests share: the stores they run on."""

from __future__ import annotations

STORES = ("memory", "sqlite", "postgres", "redis", "dynamodb")
"""Every store flowy ships, as the ``store_url`` fixture takes them."""
