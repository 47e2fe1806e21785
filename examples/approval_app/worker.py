"""The worker: pays approved requests, in a process of its own.

    python3 -m examples.approval_app.worker --backend sqlite:///approvals.db

It runs until SIGTERM or Ctrl-C, then finishes the payments in flight and exits.
"""

import argparse
import asyncio
import logging
import os
import signal

import flowy
from flowy.storage import HandoffIntent, redact_url

from .graph import PAYMENTS, Expense, Payments, graph, store_url

ExpenseWorker = flowy.Worker[Expense, flowy.NoEffect]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m examples.approval_app.worker")
    parser.add_argument("--backend", default=store_url(), help="store URL ($APP_BACKEND)")
    parser.add_argument(
        "--payments",
        default=os.environ.get("APP_PAYMENTS", "payments.db"),
        help="the payments ledger file ($APP_PAYMENTS)",
    )
    parser.add_argument("--owner", default=None, help="this worker's name in leases")
    return parser.parse_args(argv)


def make_worker(
    backend: flowy.Backend[Expense], payments_path: str | None = None, owner: str | None = None
) -> ExpenseWorker:
    """The app's worker on ``backend``, with the payments ledger bound to each run.

    ``flowy worker --app examples.approval_app.worker:make_worker`` calls it too, with
    the store it opened (the ledger is then $APP_PAYMENTS, else payments.db).
    """
    # Live dependencies reach nodes as bindings; they are never persisted.
    payments = Payments(payments_path or os.environ.get("APP_PAYMENTS", "payments.db"))
    bindings = flowy.bind(flowy.RunBindings(), PAYMENTS, payments)
    return flowy.Worker(
        flowy.Runner(graph, backend),
        owner=owner,
        resume_options=lambda intent: {"bindings": bindings},
        on_result=paid,
    )


def paid(intent: HandoffIntent, result: flowy.RunResult[Expense, flowy.NoEffect]) -> None:
    print(f"{intent.thread_id}: {result.status} {result.state.payment_id}", flush=True)


async def serve(backend_url: str, payments_path: str, owner: str | None = None) -> None:
    async with flowy.connect(backend_url) as backend:
        worker = make_worker(backend, payments_path, owner)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)  # stop claiming, drain, return
        where = redact_url(backend.url)  # never print a password
        print(f"worker {worker.owner} on {where}: waiting for payments", flush=True)
        await worker.run()
        print(f"worker {worker.owner} stopped", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args.backend, args.payments, args.owner))


if __name__ == "__main__":
    main()
