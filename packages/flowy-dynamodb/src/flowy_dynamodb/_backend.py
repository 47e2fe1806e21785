"""``DynamoBackend``: the four components over one table, and the opener of
``dynamodb://TABLE?...`` URLs for ``flowy.connect``."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from botocore.exceptions import BotoCoreError

from flowy.errors import BackendURLError
from flowy.storage import RunStatus, StateCodec
from flowy.storage.dialect import SCRATCH_PREFIX, BaseBackend, RoundTrips, StoreURL, sibling_url

from ._checkpointer import DynamoCheckpointer
from ._leases import DynamoLeaseManager
from ._outbox import DynamoConsumer, DynamoOutbox
from ._schedules import DynamoScheduleStore
from ._schema import check_version, make_client, migrate, schema_version
from ._table import Clock, DynamoTable

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["OPTIONS", "DynamoBackend", "open_backend"]

S = TypeVar("S")

OPTIONS = {
    "region": "AWS region (default: boto3's, e.g. AWS_REGION)",
    "endpoint_url": "another endpoint, e.g. DynamoDB Local (default: AWS)",
    "profile": "AWS profile of the credentials (default: boto3's chain)",
    "create_table": "create the table if it is missing (default true)",
    "max_attempts": "deliveries before a hand-off is dead-lettered (default 5)",
    "max_workers": "threads running boto3 calls, and connections (default 16)",
    "retry_attempts": "attempts of a request, botocore's retries included (default 5)",
    "retry_mode": "botocore retry mode: standard (default) or adaptive",
    "clock_skew": "seconds two clients' clocks may differ (default 2)",
    "expire_after": "seconds until a completed thread expires (default never)",
    "poll_interval": "longest pause between outbox polls while claim waits (default 0.5)",
}
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")


class DynamoBackend(BaseBackend[S], Generic[S]):
    """One DynamoDB table as a flowy store: ``flowy.connect("dynamodb://TABLE?...")``,
    or :meth:`from_client` with the application's own boto3 client.

    Args:
        client: a boto3 DynamoDB client (see :func:`~flowy_dynamodb.make_client`).
        table_name: the table; created on open if missing and ``create_table``.
        codec: the state codec (JSON by default; a runner gives a typed graph's type).
        max_attempts: deliveries of a hand-off before it is dead-lettered.
        max_workers: threads running boto3's blocking calls (calls in flight at most).
        clock_skew: seconds two clients' clocks may differ: a lease is taken over that
            long after it expired, and a client more than half of it off DynamoDB's
            clock refuses to take or renew leases (:class:`ClockSkewError`).
        expire_after: seconds after which DynamoDB's time to live deletes a completed
            thread's head and last history entry (``None``: never).
        expire_statuses: which statuses ``expire_after`` applies to.
        poll_interval: longest pause between outbox polls while ``claim`` waits.
        clock: epoch seconds (``time.time``).
        url: the URL to report (and peers to open); made from the client if omitted.
        owns_client: close ``client`` in :meth:`aclose` (``flowy.connect`` sets it).
    """

    round_trips: ClassVar[RoundTrips] = RoundTrips(segment=1, handoff=3)
    """The lease is an attribute of the head item: the ``UpdateItem`` that takes it
    returns the head, and a segment's last save removes it in the save's own
    ``TransactWriteItems``. (A lease on a thread with no head yet costs one more
    ``UpdateItem``, inside the acquisition, to give the item a time to live.)"""

    def __init__(
        self,
        client: BaseClient,
        table_name: str,
        *,
        codec: StateCodec[S] | None = None,
        create_table: bool = True,
        max_attempts: int = 5,
        max_workers: int = 16,
        clock_skew: float = 2.0,
        expire_after: float | None = None,
        expire_statuses: frozenset[RunStatus] = frozenset({RunStatus.COMPLETED}),
        poll_interval: float = 0.5,
        clock: Clock = time.time,
        url: str | None = None,
        owns_client: bool = False,
    ) -> None:
        if clock_skew < 0 or max_workers < 1 or (expire_after is not None and expire_after <= 0):
            raise ValueError(
                f"DynamoBackend needs clock_skew >= 0 (got {clock_skew!r}), max_workers >= 1 "
                f"(got {max_workers!r}) and expire_after > 0 or None (got {expire_after!r})"
            )
        self.table: DynamoTable = DynamoTable(
            client,
            table_name,
            max_workers=max_workers,
            clock_skew=clock_skew,
            expire_after=expire_after,
            clock=clock,
        )
        self.create_table = create_table
        self.owns_client = owns_client
        self.url: str = url or _url_of(client, table_name, max_attempts, clock_skew, expire_after)
        self.checkpointer: DynamoCheckpointer[S] = DynamoCheckpointer(
            self.table, codec=codec, expire_statuses=expire_statuses
        )
        self.leases: DynamoLeaseManager = DynamoLeaseManager(self.table)
        self.schedules: DynamoScheduleStore = DynamoScheduleStore(self.table)
        self.outbox: DynamoOutbox = DynamoOutbox(self.table)
        self.consumer: DynamoConsumer = DynamoConsumer(
            self.table, max_attempts=max_attempts, poll_interval=poll_interval
        )

    @classmethod
    def from_client(cls, client: BaseClient, table_name: str, **options: Any) -> DynamoBackend[S]:
        """A store over ``table_name`` with the application's ``client``, which
        :meth:`aclose` leaves open; ``options`` as for the constructor. Open it with
        ``await backend.open()`` or ``async with``."""
        return cls(client, table_name, **options)

    async def _open(self) -> None:
        check_version(await schema_version(self.table, create=self.create_table), self.table.name)

    async def _setup(self) -> int:
        return await migrate(self.table)

    async def _close(self) -> None:
        self.table.close()
        if self.owns_client:
            self.table.client.close()

    def scratch_url(self, name: str) -> str | None:
        """The same region, endpoint and options with table ``name`` (created)."""
        return sibling_url(self.url, netloc=name, options={"create_table": "true"})

    async def _drop_scratch(self) -> None:
        name = self.table.name
        if not name.startswith(SCRATCH_PREFIX):  # never an app's table
            raise RuntimeError(f"table {name!r} is not a scratch table")
        await self.table.call("delete_table", TableName=name)


def _url_of(
    client: BaseClient, table: str, max_attempts: int, skew: float, expire: float | None
) -> str:
    meta: Any = client.meta
    options: dict[str, object] = {"region": meta.region_name}
    if not str(meta.endpoint_url).endswith(".amazonaws.com"):
        options["endpoint_url"] = meta.endpoint_url
    options.update(max_attempts=max_attempts, clock_skew=f"{skew:g}")
    if expire is not None:
        options["expire_after"] = f"{expire:g}"
    return f"dynamodb://{table}?{urllib.parse.urlencode(options)}"


def _choice(text: str) -> str:
    if text not in ("standard", "adaptive"):
        raise ValueError(f"expected standard or adaptive, got {text!r}")
    return text


def _skew(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 3600:
        raise ValueError(f"expected a number of seconds from 0 to 3600, got {text[:40]!r}")
    return value


async def open_backend(url: StoreURL, *, codec: StateCodec[Any] | None) -> DynamoBackend[Any]:
    """The opener of ``dynamodb://TABLE?option=value&...`` (see :data:`OPTIONS`).

    Credentials come from boto3's chain (environment, ``profile``, instance role),
    never from the URL.
    """
    endpoint = urllib.parse.urlsplit(url.options.get("endpoint_url", ""))
    if endpoint.username is not None or endpoint.password is not None:
        raise BackendURLError("credentials do not go in endpoint_url; boto3 finds them")
    url.check_options(OPTIONS)
    parts = urllib.parse.urlsplit(url.raw)
    if parts.username is not None or parts.password is not None:
        raise BackendURLError(
            f"{url.redacted!r}: credentials do not go in a dynamodb:// URL; boto3 finds them "
            "(environment, profile=..., instance role)"
        )
    if not _TABLE_NAME.fullmatch(url.netloc) or url.path not in ("", "/"):
        raise BackendURLError(
            f"{url.redacted!r} names no DynamoDB table; use dynamodb://TABLE?region=... "
            "(3-255 letters, digits, '_', '-', '.')"
        )
    workers = url.count("max_workers", 16, maximum=1000)
    settings: dict[str, Any] = {
        "region": url.options.get("region"),
        "endpoint_url": url.options.get("endpoint_url"),
        "profile": url.options.get("profile"),
        "retry_mode": url.option("retry_mode", _choice, "standard"),
        "retry_attempts": url.count("retry_attempts", 5),
        "max_pool_connections": workers,
    }
    backend_options: dict[str, Any] = {
        "create_table": url.flag("create_table", True),
        "max_attempts": url.count("max_attempts", 5),
        "max_workers": workers,
        "clock_skew": url.option("clock_skew", _skew, 2.0),
        "expire_after": url.seconds("expire_after", 0.0, maximum=StoreURL.MAX_RETENTION_SECONDS)
        or None,
        "poll_interval": url.seconds("poll_interval", 0.5),
    }
    try:
        client = await asyncio.to_thread(make_client, **settings)
    except BotoCoreError as exc:  # no region, unknown profile…
        raise BackendURLError(f"cannot open {url.redacted!r}: {exc}") from None
    return DynamoBackend(
        client, url.netloc, codec=codec, url=url.raw, owns_client=True, **backend_options
    )
