"""The base of a lease manager: everything but its four atomic primitives.

A store subclasses :class:`BaseLeaseManager` and implements the ``_``-prefixed abstract
methods; the base owns the argument checks and the errors (the same type and message on
every store).
"""

from __future__ import annotations

import abc
from collections.abc import Hashable

from .._errors import LeaseLostError, ThreadLeaseBusyError
from ._checks import check_lease, check_owner, check_seconds, check_system_name
from ._model import Lease, validate_thread_id
from ._writes import Busy, show_id

__all__ = ["BaseLeaseManager", "busy_error"]


def busy_error(thread_id: str, holder: Lease) -> ThreadLeaseBusyError:
    """The error of an acquisition refused because ``holder`` holds the thread."""
    return ThreadLeaseBusyError(
        f"thread {show_id(thread_id)} is leased by {holder.owner!r} (fencing token "
        f"{holder.fencing_token}) until {holder.expires_at:.3f}; wait for it to end"
    )


class BaseLeaseManager(abc.ABC):
    """Exclusive, expiring, fenced leases over four primitives.

    Subclasses set ``domain`` to the same value as their store's checkpointer.
    """

    domain: Hashable = None

    @abc.abstractmethod
    async def _acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | Busy:
        """Atomically: if no live lease holds the thread, take it for ``ttl`` seconds
        with a fencing token greater than every earlier one of the thread (release and
        delete never reset it) and return it; else return :class:`Busy` with the holder."""

    @abc.abstractmethod
    async def _renew(self, lease: Lease, ttl: float) -> Lease | None:
        """Atomically extend ``lease`` to now + ``ttl`` if it is the live lease (same
        owner, compared exactly, and fencing token); else ``None``."""

    @abc.abstractmethod
    async def _release(self, lease: Lease) -> bool:
        """Atomically give ``lease`` up if it is the live lease (keeping the token
        counter); ``False`` if it expired or was taken over."""

    @abc.abstractmethod
    async def _holder(self, thread_id: str) -> Lease | None:
        """The live lease on the thread, or ``None``."""

    async def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease:
        """Take ``thread_id`` for ``owner`` for ``ttl`` seconds (``LeaseManager.acquire``)."""
        validate_thread_id(thread_id)
        check_owner(owner)
        seconds = check_seconds(ttl, "lease ttl")
        got = await self._acquire(thread_id, owner, seconds)
        if isinstance(got, Busy):
            raise busy_error(thread_id, got.holder)
        return got

    async def acquire_system(self, name: str, owner: str, ttl: float) -> Lease:
        """Take flowy's own lease ``name`` (e.g. the recovery leader's) for ``owner`` for
        ``ttl`` seconds. Its key starts with ``SYSTEM_LEASE_PREFIX``, which no thread id can, so
        it never collides with a thread; renew and release it like any lease."""
        key = check_system_name(name)
        check_owner(owner)
        seconds = check_seconds(ttl, "lease ttl")
        got = await self._acquire(key, owner, seconds)
        if isinstance(got, Busy):
            raise ThreadLeaseBusyError(
                f"the {name!r} lease is held by {got.holder.owner!r} until "
                f"{got.holder.expires_at:.3f}"
            )
        return got

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend the live ``lease`` to now + ``ttl``; ``LeaseLostError`` if it is not
        current."""
        check_lease(lease)
        seconds = check_seconds(ttl, "lease ttl")
        renewed = await self._renew(lease, seconds)
        if renewed is None:
            raise self._lost(lease, "renew")
        return renewed

    async def release(self, lease: Lease) -> None:
        """Give ``lease`` up; ``LeaseLostError`` if it expired or was taken over."""
        check_lease(lease)
        if not await self._release(lease):
            raise self._lost(lease, "release")

    async def holder(self, thread_id: str) -> Lease | None:
        """The live lease on ``thread_id``, or ``None``."""
        validate_thread_id(thread_id)
        return await self._holder(thread_id)

    @staticmethod
    def _lost(lease: Lease, action: str) -> LeaseLostError:
        return LeaseLostError(
            f"cannot {action} lease {lease.fencing_token} of {lease.owner!r} on thread "
            f"{show_id(lease.thread_id)}: it expired or was taken over"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
