"""``DynamoBackend``: the four components over one table, sharing one thread pool."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from flowy.checkpoint import RunStatus, StateCodec

from ._checkpointer import DEFAULT_INDEX_SHARDS, DynamoCheckpointer
from ._executor import DEFAULT_MAX_WORKERS, DynamoExecutor
from ._lease import DEFAULT_CLOCK_SKEW, DynamoLeaseManager
from ._outbox import DEFAULT_OUTBOX_SHARDS, DynamoOutbox, DynamoOutboxConsumer
from ._table import Clock, RetryMode, make_client

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["DynamoBackend"]

S = TypeVar("S")


@dataclass
class DynamoBackend(Generic[S]):
    """Checkpointer, lease manager, outbox and consumer over one DynamoDB table.

    The checkpointer fences with the lease manager and commits hand-offs with the outbox
    in one transaction; all four share ``executor``, so at most
    ``executor.max_workers`` DynamoDB calls are in flight. Build it with :meth:`create`
    (your client) or :meth:`connect` (a client made by :func:`make_client`).
    """

    checkpointer: DynamoCheckpointer[S]
    leases: DynamoLeaseManager
    outbox: DynamoOutbox
    consumer: DynamoOutboxConsumer
    executor: DynamoExecutor

    @classmethod
    def create(
        cls,
        client: BaseClient,
        table_name: str,
        *,
        codec: StateCodec[S] | None = None,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
        max_workers: int = DEFAULT_MAX_WORKERS,
        outbox_shards: int = DEFAULT_OUTBOX_SHARDS,
        index_shards: int = DEFAULT_INDEX_SHARDS,
        max_attempts: int = 5,
        expire_after: float | None = None,
        expire_statuses: frozenset[RunStatus] = frozenset({RunStatus.COMPLETED}),
        clock: Clock = time.time,
    ) -> DynamoBackend[S]:
        """The four components over ``table_name`` with ``client`` and a new shared
        executor of ``max_workers`` threads (closed by :meth:`close`)."""
        executor = DynamoExecutor(max_workers)
        return cls(
            checkpointer=DynamoCheckpointer(
                client,
                table_name,
                codec=codec,
                clock_skew=clock_skew,
                executor=executor,
                index_shards=index_shards,
                expire_after=expire_after,
                expire_statuses=expire_statuses,
                clock=clock,
            ),
            leases=DynamoLeaseManager(
                client, table_name, clock_skew=clock_skew, executor=executor, clock=clock
            ),
            outbox=DynamoOutbox(
                client, table_name, shards=outbox_shards, executor=executor, clock=clock
            ),
            consumer=DynamoOutboxConsumer(
                client,
                table_name,
                shards=outbox_shards,
                max_attempts=max_attempts,
                executor=executor,
                clock=clock,
            ),
            executor=executor,
        )

    @classmethod
    def connect(
        cls,
        table_name: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        retry_mode: RetryMode = "standard",
        retry_attempts: int = 5,
        codec: StateCodec[S] | None = None,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
        max_workers: int = DEFAULT_MAX_WORKERS,
        **options: Any,
    ) -> DynamoBackend[S]:
        """Like :meth:`create` with a client from :func:`make_client` (its connection
        pool sized to ``max_workers``); ``options`` go to :meth:`create`."""
        client = make_client(
            endpoint_url=endpoint_url,
            region_name=region_name,
            retry_mode=retry_mode,
            max_attempts=retry_attempts,
            max_pool_connections=max(max_workers, 10),
        )
        return cls.create(
            client,
            table_name,
            codec=codec,
            clock_skew=clock_skew,
            max_workers=max_workers,
            **options,
        )

    async def close(self) -> None:
        """Shut down the shared executor (calls in flight finish first)."""
        self.executor.close(wait=False)
