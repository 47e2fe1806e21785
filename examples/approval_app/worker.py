"""The worker: pays approved requests, in a process of its own.

    python -m examples.approval_app.worker --backend sqlite:///approvals.db

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m examples.approval_app.worker")
    parser.add_argument("--backend", default=store_url(), help="store URL ($APP_BACKEND)")
    parser.add_argument(
        "--payments",
        default=os.environ.get("APP_PAYMENTS", "payments.db"),
        help="the payments ledger file ($APP_PAYMENTS)",
    )
    parser.add_argument("--owner", default=None, help="this worker's name in leases")
    return parser.parse_args(argv)


async def serve(backend_url: str, payments_path: str, owner: str | None = None) -> None:
    async with flowy.connect(backend_url) as backend:
        runner = flowy.Runner(graph, backend)
        # Live dependencies reach nodes as bindings; they are never persisted.
        bindings = flowy.bind(flowy.RunBindings(), PAYMENTS, Payments(payments_path))

        def paid(intent: HandoffIntent, result: flowy.RunResult[Expense, flowy.NoEffect]) -> None:
            print(f"{intent.thread_id}: {result.status} {result.state.payment_id}", flush=True)

        worker = flowy.Worker(
            runner,
            owner=owner,
            resume_options=lambda intent: {"bindings": bindings},
            on_result=paid,
        )
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
