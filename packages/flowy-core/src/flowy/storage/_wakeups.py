"""In-process wake-ups of waiting consumers, for stores without notifications of their
own: a message this process adds is claimed at once, not at the next poll."""

from __future__ import annotations

import asyncio

__all__ = ["Wakeups"]


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Wakeups:
    """The consumers of one store waiting in ``claim(wait=...)`` in this process.

    A store's components share one: the outbox and the checkpointer call
    :meth:`notify` once they have added a message (the consumer too, once one is visible
    again), and the consumer's ``_wait`` calls :meth:`wait`. Safe from any thread and
    any event loop; a notification with nobody waiting is not kept.
    """

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def notify(self) -> None:
        """Wake every consumer waiting now: a message was added."""
        for waiter in list(self._waiters):
            loop = waiter.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, waiter)

    async def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for :meth:`notify`."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, seconds)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)
