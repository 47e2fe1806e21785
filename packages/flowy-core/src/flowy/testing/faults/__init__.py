"""Fault injection for tests: :class:`FaultyBackend`, one harness for every store.

A ``FaultyBackend`` wraps a ``Backend`` whose components are built on the store bases
(``BaseCheckpointer``, ``BaseLeaseManager``, ``BaseOutbox``, ``BaseConsumer``: every
store of flowy and its adapters). It strikes at the primitive layer those bases share:
the conditional write, the head read, the lease compare-and-set, the claim, the ack, …
Each primitive call is an :class:`Operation` of a :class:`Phase` (a write's phase is
read from what it writes: a step, a pending hand-off, a transactional commit, …), and a
:class:`FaultPlan` decides which :class:`Fault` strikes it:

- ``FaultyBackend.arm(phase, kind)``: the next operations of that phase (the plan of a
  hand-written test);
- :class:`RandomFaults`: at random, at a rate (the stress runs);
- a plan of your own (``flowy.testing.check`` plays its fault schedules through one).

What a fault does is its :class:`FaultKind`: the store refuses the operation
(``UNAVAILABLE``), performs it and loses the answer (``UNKNOWN``: an ambiguous
outcome), or the process dies before or right after it (``CRASH_BEFORE`` /
``CRASH_AFTER``: :class:`SimulatedCrash` is raised and every later operation of the
wrapper raises it too). ``REDELIVER`` skips an ack (the message comes back after its
visibility timeout).

``FaultyCheckpointer`` and ``FaultyOutbox`` do the same for one loose component (one
that is not part of a ``Backend``), at its public methods, with the same
:class:`Fault` and :class:`Phase`.
"""

from __future__ import annotations

from ._backend import PRIMITIVES as PRIMITIVES
from ._backend import FaultyBackend as FaultyBackend
from ._loose import FaultyCheckpointer as FaultyCheckpointer
from ._loose import FaultyOutbox as FaultyOutbox
from ._model import SAVES as SAVES
from ._model import Fault as Fault
from ._model import FaultKind as FaultKind
from ._model import FaultPlan as FaultPlan
from ._model import Operation as Operation
from ._model import Phase as Phase
from ._model import RandomFaults as RandomFaults
from ._model import SimulatedCrash as SimulatedCrash
from ._model import phase_of as phase_of

__all__ = [
    "PRIMITIVES",
    "SAVES",
    "Fault",
    "FaultKind",
    "FaultPlan",
    "FaultyBackend",
    "FaultyCheckpointer",
    "FaultyOutbox",
    "Operation",
    "Phase",
    "RandomFaults",
    "SimulatedCrash",
    "phase_of",
]
