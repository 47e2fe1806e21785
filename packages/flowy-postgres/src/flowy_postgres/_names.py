"""The names of one flowy schema: the validated, quoted table and index names, the
notification channel and the setup lock, from a schema name and a table prefix.

It imports nothing of the adapter, so connections and the schema's DDL can both use it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

__all__ = ["DEFAULT_PREFIX", "DEFAULT_SCHEMA", "MAX_PREFIX", "TableNames", "check_identifier"]

DEFAULT_SCHEMA = "public"
"""The PostgreSQL schema of the tables unless configured otherwise."""

DEFAULT_PREFIX = "flowy_"
"""The prefix of every table name unless configured otherwise."""

MAX_PREFIX = 63 - len("threads_handoff_idx")
"""The longest table prefix: every table and index name must fit 63 characters."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_identifier(value: object, what: str, *, empty: bool = False, longest: int = 63) -> str:
    """``value`` if it is a plain identifier (letters, digits, underscores) that fits."""
    if not isinstance(value, str) or not (_IDENTIFIER.fullmatch(value) or (empty and value == "")):
        raise ValueError(
            f"{what} {value!r} is not a plain identifier; use letters, digits and "
            f"underscores, starting with a letter or underscore{' (or empty)' if empty else ''}"
        )
    if len(value) > longest:
        raise ValueError(f"{what} {value!r} is {len(value)} characters long; at most {longest} fit")
    return value


@dataclass(frozen=True, slots=True)
class TableNames:
    """The validated, quoted names of one flowy schema (a schema name plus a prefix)."""

    schema: str = DEFAULT_SCHEMA
    prefix: str = DEFAULT_PREFIX
    threads: str = field(init=False)
    history: str = field(init=False)
    leases: str = field(init=False)
    outbox: str = field(init=False)
    signals: str = field(init=False)
    journal: str = field(init=False)
    schedules: str = field(init=False)
    queue_limits: str = field(init=False)
    queue_starts: str = field(init=False)
    claim: str = field(init=False)
    version: str = field(init=False)
    channel: str = field(init=False)
    lock_key: int = field(init=False)

    def __post_init__(self) -> None:
        check_identifier(self.schema, "schema name")
        check_identifier(self.prefix, "table prefix", empty=True, longest=MAX_PREFIX)
        for table in (
            *("threads", "history", "leases", "outbox", "signals", "journal", "schedules"),
            *("queue_limits", "queue_starts"),
        ):
            object.__setattr__(self, table, self.table(table))
        object.__setattr__(self, "claim", self.table("claim"))  # the claim function
        object.__setattr__(self, "version", self.table("schema_version"))
        channel = f"{self.schema}.{self.prefix}outbox"
        if len(channel) > 63:
            channel = "flowy_outbox_" + hashlib.sha256(channel.encode()).hexdigest()[:40]
        object.__setattr__(self, "channel", channel)
        # Setups of one schema serialise on this advisory lock (transaction-scoped).
        digest = hashlib.sha256(f"flowy-migrate:{self.schema}".encode()).digest()
        object.__setattr__(self, "lock_key", int.from_bytes(digest[:8], "big", signed=True))

    def table(self, suffix: str) -> str:
        """The quoted, schema-qualified name of a table."""
        return f'"{self.schema}"."{self.prefix}{suffix}"'

    def index(self, suffix: str) -> str:
        """The quoted, unqualified name of one of the schema's indexes."""
        return f'"{self.prefix}{suffix}"'
