"""Expense approvals: a human in the loop, then two worker processes on one database.

Each expense request is drafted and suspends until a manager approves it. The approval
is applied as a state overlay and the run hands off to the background: the checkpoint
and its outbox message commit in one PostgreSQL transaction. Two worker OS processes,
each with its own connection pool, share that outbox (claims skip each other's locked
rows) and book the payments with an idempotency key. A second manager approving from a
stale page (an already used resume token) is rejected by optimistic concurrency.

    python examples/postgres_hitl_workers.py

PostgreSQL comes from ``FLOWY_POSTGRES_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/test``). Everything lives in a schema of its own,
created by ``flowy.connect`` (``?schema=...``) and dropped at the end. The script starts its
workers as ``python examples/postgres_hitl_workers.py worker NAME SCHEMA``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from dataclasses import dataclass, replace
from typing import Any

import flowy
from flowy.storage import Backend

DSN = os.environ.get("FLOWY_POSTGRES_DSN") or "postgresql://postgres@127.0.0.1:5432/test"
WORKERS = ("worker-a", "worker-b")
EMPLOYEES = ["ana", "ben", "chloe", "dev", "eli", "fay", "gus", "hana"]  # a request each
BOOKING_SECONDS = 0.2  # the slow bank call; long enough that both workers get a share
DEADLINE = 15.0  # seconds a worker may run before it gives up
WEB = ("web", 10.0)  # the foreground's run lease: (owner, ttl seconds)
APP_TABLES = """
CREATE TABLE "{schema}".payments (
    idempotency_key text PRIMARY KEY,
    amount integer NOT NULL,
    booked_by text NOT NULL,
    bookings integer NOT NULL DEFAULT 1
);
CREATE TABLE "{schema}".workers_ready (name text PRIMARY KEY);
"""


@dataclass
class Expense:
    expense_id: str
    employee: str
    amount: int
    memo: str = ""
    approved_by: str = ""
    payment_ref: str = ""
    booked_by: str = ""


@dataclass(frozen=True)
class Bank:
    """The payments table (the application's own), as seen by one worker."""

    pool: Any  # an asyncpg pool (asyncpg ships no types)
    schema: str
    worker: str

    async def pay(self, key: str, amount: int) -> None:
        await asyncio.sleep(BOOKING_SECONDS)
        # A repeated booking with the same key pays nothing; it only counts the attempt.
        await self.pool.execute(
            f'INSERT INTO "{self.schema}".payments (idempotency_key, amount, booked_by) '
            "VALUES ($1, $2, $3) ON CONFLICT (idempotency_key) "
            "DO UPDATE SET bookings = payments.bookings + 1",
            key,
            amount,
            self.worker,
        )


BANK = flowy.BindingKey[Bank]("bank")
Step = tuple[Expense, flowy.Directive[flowy.NoEffect]]


async def draft(state: Expense) -> Step:
    return replace(state, memo=f"{state.employee} asks for ${state.amount}"), flowy.completed()


async def approval(state: Expense) -> Step:
    if not state.approved_by:
        return state, flowy.suspend("awaiting_manager")
    return state, flowy.handoff("book_payment", resume_at="book")


async def book(state: Expense) -> Step:
    bank = flowy.binding(BANK)
    key = f"pay-{state.expense_id}"
    await bank.pay(key, state.amount)
    return replace(state, payment_ref=key, booked_by=bank.worker), flowy.completed()


def approve(stored: Expense, overlay: Expense) -> Expense:
    return replace(stored, approved_by=overlay.approved_by)


def make_runner(backend: Backend[Any]) -> flowy.Runner[Expense, flowy.NoEffect]:
    # state=Expense: the runner decodes stored states into Expense.
    b = flowy.GraphBuilder[Expense, flowy.NoEffect](state=Expense)
    b.add_node("draft", draft).add_node("approval", approval).add_node("book", book)
    b.add_edge("draft", "approval").add_edge("approval", "book")
    b.allow_no_outgoing_route("book")
    return flowy.Runner(b.compile(), backend)


async def connect(schema: str) -> Backend[Any]:
    """The store: checkpoints, leases and the outbox in ``schema`` (created if new)."""
    return await flowy.connect(f"{DSN}{'&' if '?' in DSN else '?'}schema={schema}&pool_size=4")


def pool_of(backend: Backend[Any]) -> Any:
    """The backend's asyncpg pool, which this demo's own tables share."""
    return getattr(backend, "pool")  # noqa: B009 - PostgresBackend.pool, not on the protocol


# -- the foreground: requests and approvals ------------------------------------------


async def foreground(runner: flowy.Runner[Expense, flowy.NoEffect]) -> None:
    pages: dict[str, flowy.RunResult[Expense, flowy.NoEffect]] = {}
    for n, employee in enumerate(EMPLOYEES, 1):
        thread_id = f"expense-{n}"
        request = Expense(thread_id, employee, amount=70 * n + 15)
        asked = await runner.start(thread_id, request, run_lease=WEB)
        assert asked.resume_token is not None
        pages[thread_id] = asked  # what a manager's approval page shows
        overlay = replace(asked.state, approved_by="maria")
        approved = await runner.resume(
            asked.resume_token, state_overlay=overlay, merge=approve, run_lease=WEB
        )
        print(
            f"{thread_id}: {asked.state.memo} -> {asked.status} ({asked.reason}) "
            f"-> approved by maria -> {approved.status} ({approved.reason})"
        )
    # Bob opened expense-2 before maria approved it; his click carries the old token.
    page = pages["expense-2"]
    assert page.resume_token is not None
    overlay = replace(page.state, approved_by="bob")
    try:
        await runner.resume(page.resume_token, state_overlay=overlay, merge=approve, run_lease=WEB)
    except flowy.ConcurrencyConflictError as exc:
        print(f"stale approval by bob for expense-2 rejected: {exc}")
    else:
        raise SystemExit("the stale approval by bob was accepted; it should have conflicted")


# -- the background: two worker processes ----------------------------------------------


async def serve(name: str, schema: str) -> None:
    """One worker process: its own pool, flowy.Worker until no work arrives for 1 s."""
    backend = await connect(schema)
    pool = pool_of(backend)
    try:
        bindings = flowy.bind(flowy.RunBindings(), BANK, Bank(pool, schema, name))
        worker = flowy.Worker(
            make_runner(backend),
            owner=name,
            lease_ttl=10.0,
            concurrency=1,
            resume_options=lambda _intent: {"bindings": bindings},
        )

        async def work() -> int:
            # Demo only: wait for the other worker so that both are up when work starts.
            await pool.execute(f'INSERT INTO "{schema}".workers_ready VALUES ($1)', name)
            while True:
                ready = await pool.fetchval(f'SELECT count(*) FROM "{schema}".workers_ready')
                if ready >= len(WORKERS):
                    break
                await asyncio.sleep(0.05)
            return await worker.run_until_idle(idle_wait=1.0)

        handled = await asyncio.wait_for(work(), DEADLINE)
        outcomes = {k: v for k, v in worker.stats.outcomes.items() if v}
        print(f"{name} (pid {os.getpid()}) handled {handled} message(s): {outcomes}")
    finally:
        await backend.aclose()


async def run_workers(schema: str) -> None:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, __file__, "worker", name, schema, stdout=asyncio.subprocess.PIPE
        )
        for name in WORKERS
    ]
    try:
        outputs = await asyncio.wait_for(
            asyncio.gather(*(p.communicate() for p in procs)), DEADLINE + 5
        )
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    for proc, (out, _) in zip(procs, outputs, strict=True):
        print(out.decode(), end="")
        if proc.returncode != 0:
            raise SystemExit(f"a worker process exited with status {proc.returncode}")


async def report(backend: Backend[Any], schema: str) -> None:
    pool = pool_of(backend)
    runner = make_runner(backend)
    rows: list[Any] = await pool.fetch(f'SELECT * FROM "{schema}".payments')
    bookings: dict[str, int] = {row["idempotency_key"]: row["bookings"] for row in rows}
    ran: dict[str, list[str]] = {name: [] for name in WORKERS}
    problems: list[str] = []
    for n in range(1, len(EMPLOYEES) + 1):
        snap, token = await runner.head(f"expense-{n}")
        e = snap.state
        count = bookings.get(f"pay-{e.expense_id}", 0)
        print(
            f"  {e.expense_id}: {snap.status} at revision {token.snapshot_revision}, approved by "
            f"{e.approved_by}, {e.payment_ref} booked {count}x by {e.booked_by}"
        )
        ran.setdefault(e.booked_by, []).append(e.expense_id)
        if snap.status is not flowy.RunStatus.COMPLETED or count != 1 or e.approved_by != "maria":
            problems.append(e.expense_id)
    for name, threads in ran.items():
        print(f"{name} ran {len(threads)} thread(s): {', '.join(threads)}")
    if problems or len(rows) != len(EMPLOYEES):
        raise SystemExit(f"not completed exactly once: {problems}, {len(rows)} payment row(s)")
    print(f"every thread completed exactly once: {len(EMPLOYEES)} threads, {len(rows)} payments")


async def demo() -> None:
    schema = f"flowy_example_{secrets.token_hex(4)}"
    try:
        backend = await asyncio.wait_for(connect(schema), 5.0)
    except (OSError, TimeoutError, flowy.StorageError) as exc:
        cause = exc.__cause__ or exc
        detail = " ".join(f"{type(cause).__name__}: {cause}".split())
        raise SystemExit(
            f"postgres_hitl_workers: PostgreSQL is not reachable at {DSN!r} ({detail}); "
            "start it or set FLOWY_POSTGRES_DSN"
        ) from None
    pool = pool_of(backend)
    try:
        await pool.execute(APP_TABLES.format(schema=schema))
        print(f"schema {schema} created")
        await foreground(make_runner(backend))
        await run_workers(schema)
        await report(backend, schema)
    finally:
        await pool.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await backend.aclose()
        print(f"schema {schema} dropped")


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        asyncio.run(serve(sys.argv[2], sys.argv[3]))
    else:
        asyncio.run(demo())
