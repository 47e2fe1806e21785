"""Crash-safety checking of your own graph: ``flowy.testing.check(graph, scenario)``.

The checker plays every part around the graph: the application that starts the thread
and retries a call that failed, the human who approves a suspended run, the outside
world that sends signals, the clock, and the processes that run it: foreground callers
and ``flowy.Worker`` processes. Each run follows a deterministic random schedule of
faults, drawn from its seed:

- a process crashes before or right after a store operation (every save, activity
  journal record, outbox write, ack and lease): "crash after node 'refund' returned,
  before save #3" is a crash between a side effect and the save that records it;
- the store refuses an operation (transient unavailability), or performs it and loses
  the answer (unknown commit outcome);
- a run's lease expires mid-run and another process takes the thread over;
- a hand-off message's ack is lost and the message is delivered again, late;
- two processes resume one suspended thread with the same token at once;
- a waiting thread's timer fires before the signal it waits for.

A crashed process's lease and claimed messages are given up, as their expiry would, and
the next process carries on, until the thread is finished or waits for something no one
will send. Then the checker verifies:

- the thread ends in a terminal state, or suspended or waiting for a reply the scenario
  does not give;
- no hand-off is lost (a hand-off head, a dead letter) or resumed twice (a second
  delivery ran steps after the first one's end was saved);
- the history is one chain of consecutive revisions;
- every activity's function was called at most once (``idempotent=True`` ones may be
  called again), and exactly once for the keys in ``Scenario.exactly_once``; no effect
  was delivered more often than it was saved;
- your invariants (``@flowy.invariant``) over every saved state, and your scenario's
  post-conditions (``Scenario.expect``) over the final state and your fakes.

A failing run is shrunk to the fewest faults that still fail, and printed with its seed,
its schedule in words, the thread's history and a command that replays it. The memory
store is the default (a fresh one per run, on a simulated clock); ``store=URL`` runs the
same schedules on a real store, in a scratch store of its own next to the one ``URL``
names (``flowy.storage.dialect.open_scratch``), removed when the check ends. See
``docs/checking.md``.

Its parts: ``_report`` (scenarios, reports, schedules), ``_process`` (the simulated
processes, each over a ``flowy.testing.faults.FaultyBackend`` whose plan is the run's
operation log), ``_run`` (one run: the world around the thread), ``_verify`` (what is
checked) and ``_search`` (seeds, shrinking, the event loop).
"""

from __future__ import annotations

from ..faults import Fault as Fault
from ..faults import FaultKind as FaultKind
from ._report import CheckReport as CheckReport
from ._report import Counterexample as Counterexample
from ._report import Scenario as Scenario
from ._report import parse_schedule as parse_schedule
from ._search import acheck as acheck
from ._search import check as check

__all__ = [
    "CheckReport",
    "Counterexample",
    "Fault",
    "FaultKind",
    "Scenario",
    "acheck",
    "check",
    "parse_schedule",
]
