"""``flowy worker``: a ``flowy.Worker`` on any store, telling what it does.

The worker is the library's own. What it prints comes from the outside: a watch on the
consumer it claims from (each claim, ack, release and dead letter), the worker's
``on_result`` hook (each run's effects and how it ended) and its log records. With
``--once`` the exit status says whether everything it claimed went through: 1 if a
message was released for another delivery or dead-lettered during the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import logging
import signal
from collections.abc import Callable, Generator
from typing import Any, cast

from .._results import RunResult
from .._runner import Runner, default_owner
from .._worker import ResumeOptions, Worker, WorkerOptions
from ..storage import DeadLetter, HandoffIntent, OutboxConsumer, OutboxMessage, RunStatus
from ..storage._model import DEFAULT_QUEUE
from ..storage.dialect import BaseConsumer
from ._options import CliError, load_graph, load_object, one_line, quote
from ._render import Console, clean, effect_text, result_line
from ._store import DEAD_LETTER_SCAN, Store, codec_for, locate, open_store

__all__ = ["WatchedConsumer", "cmd_worker", "load_app", "make_app"]


class WatchedConsumer:
    """An ``OutboxConsumer`` that passes every call to ``inner`` and prints what
    happened to each message on ``out``."""

    def __init__(self, inner: OutboxConsumer, out: Console, store: Store, *, tag: bool) -> None:
        self.inner = inner
        self.out = out
        self.store = store
        self.tag = tag
        self.resumed: set[str] = set()
        self.released = 0
        self.dead: set[str] = set()

    @property
    def max_attempts(self) -> int:
        """The inner consumer's ``max_attempts``."""
        return self.inner.max_attempts

    @property
    def keeps_queues(self) -> bool:
        """Whether the inner consumer claims from named queues."""
        return isinstance(self.inner, BaseConsumer) and self.inner.keeps_queues

    def _token(self, message: OutboxMessage) -> str:
        return clean(str(message.intent.resume_token), 60)

    def _suffix(self, message: OutboxMessage) -> str:
        return f" ({self._token(message)})" if self.tag else ""

    async def claim(
        self,
        limit: int,
        visibility_timeout: float,
        wait: float = 0.0,
        *,
        queue: str = DEFAULT_QUEUE,
        held: int = 0,
    ) -> list[OutboxMessage]:
        """Claim (from ``queue``, if the inner consumer keeps queues), and print each
        message taken."""
        inner = self.inner
        if isinstance(inner, BaseConsumer) and inner.keeps_queues:
            messages = await inner.claim(limit, visibility_timeout, wait, queue=queue, held=held)
        else:
            messages = await inner.claim(limit, visibility_timeout, wait)
        out = self.out
        for m in messages:
            intent = m.intent
            out.line(
                f"{out.paint(out.sym('claim'), 'cyan')} {out.paint(self._token(m), 'bold')} "
                f"delivery {m.attempts} ({clean(intent.reason, 40)} at "
                f"{clean(intent.execution_pointer, 40)})"
            )
            if m.last_error:
                failed = clean(" ".join(m.last_error.split()), 160)
                out.line(out.paint(f"  the last delivery failed: {failed}", "dim"))
        return messages

    async def ack(self, message: OutboxMessage) -> None:
        """Ack, and say so."""
        await self.inner.ack(message)
        self.acked_in_save(message)

    def acked_in_save(self, message: OutboxMessage) -> None:
        """Say that ``message`` was acknowledged (by the resumed run's last save, where
        the store can, or by :meth:`ack`)."""
        out = self.out
        key = message.intent.intent_id
        what = "resumed" if key in self.resumed else "nothing left to run"
        self.resumed.discard(key)
        out.line(f"{out.paint(out.sym('ok'), 'green')} acked: {what}{self._suffix(message)}")

    async def release(
        self, message: OutboxMessage, *, error: str = "", delay: float = 0.0, dead: bool = False
    ) -> None:
        """Release, and say whether the message will come back or is now a dead letter."""
        if dead:
            await self.inner.release(message, error=error, delay=delay, dead=True)
        else:  # an inner consumer written before ``dead`` existed still works here
            await self.inner.release(message, error=error, delay=delay)
        out = self.out
        self.resumed.discard(message.intent.intent_id)
        reason = clean(" ".join(error.split()), 160) or "no error recorded"
        if dead or message.attempts >= self.inner.max_attempts:
            self.dead.add(message.message_id)
            after = "at once" if dead else f"after {message.attempts} deliveries"
            out.line(
                out.paint(f"{out.sym('fail')} dead-lettered", "red", "bold")
                + f" {after}{self._suffix(message)}: {reason}"
            )
            retry = self.store.command("dead-letters", "--retry", quote(message.message_id))
            out.line(f"  requeue it once the cause is fixed: {clean(retry)}")
        else:
            self.released += 1
            out.line(
                f"{out.paint(out.sym('retry'), 'yellow')} released for another delivery"
                f"{self._suffix(message)}: {reason}"
            )

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The inner consumer's dead letters."""
        return await self.inner.dead_letters(limit)

    async def retry_dead_letter(self, message_id: str) -> None:
        """Requeue through the inner consumer."""
        await self.inner.retry_dead_letter(message_id)

    def on_result(self, intent: HandoffIntent, result: RunResult[Any, Any]) -> None:
        """The worker's ``on_result`` hook: print the run's effects and its end."""
        out = self.out
        label = f"[{clean(intent.thread_id, 40)}] " if self.tag else ""
        for effect in result.effects:
            out.line(
                f"    {label}{out.paint(out.sym('effect'), 'magenta')} effect "
                f"{effect_text(out, effect)}"
            )
        out.line(f"  {label}{result_line(out, result)}")
        if result.status is not RunStatus.FAILED or result.revision != intent.snapshot_revision:
            self.resumed.add(intent.intent_id)


class _LogToConsole(logging.Handler):
    """Prints flowy's log records as single, escaped lines."""

    def __init__(self, out: Console) -> None:
        super().__init__(logging.INFO)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = " ".join(record.getMessage().split())
        except Exception:  # noqa: BLE001 - a log record that cannot format is still shown
            text = str(record.msg)
        style = "dim" if record.levelno < logging.WARNING else "yellow"
        self.out.line(self.out.paint(f"  {clean(text, 300)}", style))


@contextlib.contextmanager
def _logs_on(out: Console) -> Generator[None]:
    logger = logging.getLogger("flowy")
    handler = _LogToConsole(out)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


async def _run_until_signal(worker: Worker[Any, Any], out: Console) -> None:
    """``worker.run()`` until SIGINT or SIGTERM: the first lets the runs in flight
    finish; a second stops them now (each saves its cancel snapshot and lets go of its
    lease before the store closes) and ends the command as interrupted."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    installed: list[int] = []
    signals = 0

    def stopping() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            out.line(
                out.paint(
                    "stopping: finishing the runs in flight (Ctrl-C again stops them now)", "dim"
                )
            )
            worker.stop()
        elif signals == 2 and task is not None:
            out.line(out.paint("stopping the runs in flight: each saves where it is", "dim"))
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stopping)
            installed.append(sig)
    try:
        await worker.run()
    except asyncio.CancelledError:
        if signals < 2 or task is None:
            raise
        task.uncancel()
        raise CliError("interrupted", 130) from None
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def _buried_since(watch: WatchedConsumer, before: set[str]) -> list[DeadLetter]:
    """Dead letters that appeared during the run without a release of ours: messages
    the consumer buried while claiming (undecodable, or delivered too often)."""
    now = await watch.inner.dead_letters(DEAD_LETTER_SCAN)
    return [d for d in now if d.message_id not in before and d.message_id not in watch.dead]


AppFactory = Callable[[Any], object]


def load_app(spec: str) -> AppFactory:
    """The app factory named by ``spec``: a function (or coroutine function) that takes
    the opened backend and returns a ``flowy.Worker`` or a ``flowy.Runner``."""
    factory = load_object(spec, "--app")
    if not callable(factory):
        raise CliError(
            f"--app {spec!r} is a {type(factory).__name__}, not a function (give a function "
            "that takes the opened backend and returns a flowy.Worker or a flowy.Runner)",
            2,
        )
    return cast(AppFactory, factory)


async def make_app(
    spec: str, factory: AppFactory, backend: Any
) -> tuple[Runner[Any, Any], ResumeOptions | None]:
    """The runner and ``resume_options`` the app's factory makes on ``backend``: those of
    the ``flowy.Worker`` it returns (its resume options give each run the app's
    bindings), or its ``flowy.Runner`` alone. Anything else, or a factory that raises,
    is a usage error."""
    try:
        made: object = factory(backend)
        if inspect.isawaitable(made):
            made = await made
    except Exception as exc:
        raise CliError(
            f"--app {spec!r}: calling it failed: {type(exc).__name__}: {one_line(str(exc))}", 2
        ) from exc
    if isinstance(made, Worker):
        app_worker = cast(Worker[Any, Any], made)
        return app_worker.runner, app_worker.options.resume_options
    if isinstance(made, Runner):
        return cast(Runner[Any, Any], made), None
    raise CliError(
        f"--app {spec!r} returned a {type(made).__name__}, not a flowy.Worker or a "
        "flowy.Runner (give a function that takes the opened backend and returns one)",
        2,
    )


async def cmd_worker(args: argparse.Namespace, out: Console) -> int:
    """``flowy worker``."""
    store = locate(args.backend, args.db)
    factory = load_app(args.app) if args.app else None
    graph = None if factory else load_graph(args.graph)
    owner = cast(str, args.owner or default_owner())
    async with open_store(store, codec_for(args.codec, graph)) as backend:
        if factory is not None:
            runner, resume_options = await make_app(args.app, factory, backend)
            what = f"app {args.app}"
        else:
            assert graph is not None
            runner, resume_options = Runner(graph, backend), None
            what = f"graph {args.graph}"
        if args.queues:
            what += f" {out.sym('dot')} queue{'s' if len(args.queues) > 1 else ''} "
            what += ", ".join(args.queues)
        watch = WatchedConsumer(backend.consumer, out, store, tag=args.concurrency > 1)
        before = {d.message_id for d in await backend.consumer.dead_letters(DEAD_LETTER_SCAN)}
        options = WorkerOptions(
            owner=owner,
            resume_options=resume_options,
            lease_ttl=args.lease_ttl,
            concurrency=args.concurrency,
            visibility_timeout=args.visibility_timeout,
            poll_interval=args.poll_interval,
            recovery_interval=(
                None if args.once or args.recovery_interval <= 0 else args.recovery_interval
            ),
            stale_after=args.stale_after,
            on_result=watch.on_result,
            retry_delay=args.retry_delay,
            max_retry_delay=max(300.0, args.retry_delay),
            queues=tuple(args.queues or (DEFAULT_QUEUE,)),
        )
        try:
            worker: Worker[Any, Any] = Worker(runner, watch, options=options)
        except ValueError as exc:  # queues on a store that keeps none
            raise CliError(one_line(str(exc)), 2) from None
        dot = out.sym("dot")
        out.line(
            out.paint(
                f"{clean(owner)} {dot} claiming hand-offs from {clean(store.label)} {dot} "
                f"{clean(what)}",
                "dim",
            )
        )
        with _logs_on(out):
            if args.once:
                await worker.run_until_idle(args.idle_wait)
            else:
                await _run_until_signal(worker, out)
        buried = await _buried_since(watch, before)
    for letter in buried:
        what = clean(letter.thread_id, 48) if letter.intent else "an undecodable message"
        out.line(
            out.paint(f"{out.sym('fail')} dead-lettered while claiming", "red", "bold")
            + f": message {clean(letter.message_id, 80)} of {what}: "
            + clean(" ".join(letter.error.split()), 160)
        )
    outcomes = worker.stats.outcomes
    done = sum(outcomes.values())
    counts = ", ".join(f"{k} {v}" for k, v in outcomes.items() if v)
    summary = f"{clean(owner)}: {done} message(s) processed" + (f" ({counts})" if counts else "")
    failed = len(watch.dead) + len(buried)
    if failed:
        listing = store.command("dead-letters")
        summary += f"; {failed} dead-lettered (`{clean(listing)}` lists them)"
    out.line(out.paint(summary, "dim"))
    return 1 if args.once and (watch.released or failed) else 0
