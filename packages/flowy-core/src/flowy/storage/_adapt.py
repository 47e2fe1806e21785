"""One store model: loose components wrapped into a ``Backend`` once, and what the engine
uses of a backend, decided once.

:func:`as_backend` turns a checkpointer and, optionally, a lease manager, an outbox and a
consumer (the 0.1 way of building a runner) into a :class:`ComponentBackend`.
:func:`backend_of` is what ``Runner`` calls with what it was given: a backend as it is,
anything else through :func:`as_backend` with a ``DeprecationWarning``. :func:`bind`
reads a backend's :class:`~flowy.storage.Capabilities` and components once, when a
runner is built: the engine never looks at a store's type or attributes after that.

This is the only place where components that are not built on the bases of
:mod:`flowy.storage` are looked at for what they may offer (a ``domain``, a codec,
``with_codec``, a codec's ``merge``); a store built on the bases declares all of them.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, Self, cast, runtime_checkable

from .._types import S
from ._backend import BaseBackend, redact_url
from ._base import BaseCheckpointer
from ._capabilities import Capabilities
from ._codecs import JSONCodec, StateCodec, codec_for_type, is_plain_json_type
from ._derive import derive_capabilities
from ._guard import LeaseGuardCheckpointer
from ._limits import Limits
from ._protocols import (
    Backend,
    Checkpointer,
    DurableCheckpointer,
    LeaseManager,
    Outbox,
    OutboxConsumer,
    TransactionalCheckpointer,
    TransactionalOutbox,
)
from ._watch import HUB, WatchEvent, encode_progress, follow_thread, subscribe_hub

__all__ = [
    "Binding",
    "ComponentBackend",
    "as_backend",
    "backend_of",
    "bind",
    "opened_backend",
]

Merge = Callable[[Any, Mapping[str, Any]], Any]


class ComponentBackend(Generic[S]):
    """A ``Backend`` made of components that were built one by one (:func:`as_backend`).

    It owns nothing: ``aclose`` and ``setup`` leave the components' stores to whoever
    opened them. A component it was not given is absent: its capability is ``False``
    and reading it raises ``TypeError`` saying what to pass instead.
    """

    def __init__(
        self,
        checkpointer: Checkpointer[S],
        *,
        leases: LeaseManager | None = None,
        outbox: Outbox | None = None,
        consumer: OutboxConsumer | None = None,
        url: str = "",
    ) -> None:
        self.url = url
        self._checkpointer = checkpointer
        self._leases = leases
        self._outbox = outbox
        self._consumer = consumer
        self.capabilities: Capabilities = derive_capabilities(
            checkpointer, leases, outbox, consumer
        )

    @property
    def checkpointer(self) -> Checkpointer[S]:
        """The checkpointer it was given."""
        return self._checkpointer

    def watch(
        self, thread_id: str, *, after: int | None = None, poll: float = 0.2
    ) -> AsyncIterator[WatchEvent[S]]:
        """Follow ``thread_id`` (``BaseBackend.watch``): loose components have no
        channel, so progress arrives from runs in this process only."""
        cp = self._checkpointer
        domain = getattr(cp, "domain", None)
        key: Hashable = domain if domain is not None else id(cp)
        return follow_thread(
            cp, thread_id, after, poll, lambda inbox: subscribe_hub(key, thread_id, inbox)
        )

    @property
    def leases(self) -> LeaseManager:
        """The lease manager it was given (``TypeError`` if none)."""
        if self._leases is None:
            raise TypeError(
                "this store was built without a lease manager: pass "
                "flowy.storage.as_backend(checkpointer, leases=...) or use a Backend"
            )
        return self._leases

    @property
    def outbox(self) -> Outbox:
        """The outbox it was given (``TypeError`` if none)."""
        if self._outbox is None:
            raise TypeError(
                "this store was built without an outbox: pass "
                "flowy.storage.as_backend(checkpointer, outbox=...) or use a Backend"
            )
        return self._outbox

    @property
    def consumer(self) -> OutboxConsumer:
        """The consumer it was given (``TypeError`` if none)."""
        if self._consumer is None:
            raise TypeError(
                "this store was built without a consumer: pass Worker(runner, consumer) or "
                "flowy.storage.as_backend(checkpointer, consumer=...), or use a Backend"
            )
        return self._consumer

    async def setup(self) -> int:
        """Nothing to do: the components' stores are set up by whoever opened them.
        Returns 0."""
        return 0

    async def aclose(self) -> None:
        """Nothing to release: the components' resources are their owners'."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        shown = f"{redact_url(self.url)!r}, " if self.url else ""
        return f"{type(self).__name__}({shown}{type(self._checkpointer).__name__})"


def as_backend(
    checkpointer: Checkpointer[S],
    *,
    leases: LeaseManager | None = None,
    outbox: Outbox | None = None,
    consumer: OutboxConsumer | None = None,
    url: str = "",
) -> ComponentBackend[S]:
    """A ``Backend`` made of loose components, with its capabilities derived from them.

    For components built one by one (a checkpointer wrapped for a test, a lease manager
    of the same store, …); a store opened with ``flowy.connect`` is a backend already.

    Args:
        checkpointer: the snapshot store.
        leases: its lease manager (``None``: runs take no leases).
        outbox: where hand-offs go (``None``: a hand-off is saved, nothing enqueued).
        consumer: what a ``flowy.Worker`` claims from (``None``: pass one to the worker).
        url: a label for reprs and metrics (the components were not opened from a URL).
    """
    return ComponentBackend(checkpointer, leases=leases, outbox=outbox, consumer=consumer, url=url)


@runtime_checkable
class _Parts(Protocol):
    """A 0.2 backend: the four components, without declared capabilities."""

    @property
    def checkpointer(self) -> Any: ...
    @property
    def leases(self) -> Any: ...
    @property
    def outbox(self) -> Any: ...
    @property
    def consumer(self) -> Any: ...


def opened_backend(store: object) -> bool:
    """True if ``store`` is a backend of its own (opened by ``flowy.connect`` or built on
    ``BaseBackend``), not loose components (a checkpointer, :func:`as_backend`'s)."""
    if isinstance(store, ComponentBackend):
        return False
    return isinstance(store, BaseBackend | Backend | _Parts)


def _warn_loose(what: str) -> None:
    warnings.warn(
        f"Runner({what}) is deprecated: build the runner on a Backend, "
        "e.g. Runner(graph, await flowy.connect(url)), or wrap the components once with "
        "flowy.storage.as_backend(checkpointer, leases=..., outbox=...)",
        DeprecationWarning,
        stacklevel=4,
    )


def backend_of(store: object, leases: LeaseManager | None, outbox: Outbox | None) -> Backend[Any]:
    """The backend a runner talks to, from what it was given: ``store`` itself when it is
    a backend and no component replaces one of its own; otherwise its components (or the
    bare checkpointer ``store``) with ``leases`` / ``outbox``, through :func:`as_backend`,
    with a ``DeprecationWarning``."""
    if isinstance(store, BaseBackend | ComponentBackend | Backend):
        backend = cast(Backend[Any], store)
        if leases is None and outbox is None:
            return backend
        _warn_loose("backend, lease_manager=..., handoff_outbox=...")
        return as_backend(
            backend.checkpointer,
            leases=leases if leases is not None else backend.leases,
            outbox=outbox if outbox is not None else backend.outbox,
            consumer=backend.consumer,
            url=backend.url,
        )
    if isinstance(store, _Parts):
        # A backend of 0.2, not built on BaseBackend: its parts, wrapped without a
        # warning (it is a backend; it only does not declare its capabilities).
        return as_backend(
            store.checkpointer,
            leases=leases if leases is not None else store.leases,
            outbox=outbox if outbox is not None else store.outbox,
            consumer=store.consumer,
            url=str(cast(Any, store).url),
        )
    _warn_loose("checkpointer" + (", lease_manager=..." if leases is not None else ""))
    return as_backend(cast(Checkpointer[Any], store), leases=leases, outbox=outbox)


@dataclass(frozen=True, slots=True)
class Binding(Generic[S]):
    """What the engine uses of one backend, decided once when a runner is built."""

    backend: Backend[S]
    capabilities: Capabilities
    checkpointer: Checkpointer[S]
    """The checkpointer runs save through: decoding into the graph's state type, and
    wrapped in a ``LeaseGuardCheckpointer`` when the store does not fence its leases."""
    leases: LeaseManager | None
    outbox: Outbox | None
    transactional: tuple[TransactionalCheckpointer[S], TransactionalOutbox] | None
    """The checkpointer and outbox of a one-write hand-off (``None``: three phases)."""
    durable: DurableCheckpointer[S] | None
    """Timers and signals (``None``: the store keeps none)."""
    journal: DurableCheckpointer[S] | None
    """The activity journal (``None``: the store keeps none)."""
    codec: StateCodec[Any] | None
    """The codec states are stored with, if the store says."""
    merge_codec: StateCodec[Any] | None
    """The codec that validates merged fields (a store built on the bases)."""
    merge: Merge | None
    """``merge_codec``'s ``merge(state, fields)``, if it has one."""
    limits: Limits
    domain: Hashable
    """The store's identity (one run of a thread at a time per store, in a process)."""
    progress: Progress
    """Sends a run's progress to its thread's watchers (``flowy.live.progress``)."""
    flush_progress: Callable[[], Awaitable[None]] | None
    """Waits until the progress sent so far has left (before the next save)."""


Progress = Callable[[str, str, int, object], None]
"""``(thread_id, node, revision, data)``: sends one progress event to the watchers."""


def _progress_of(backend: object, domain: Hashable) -> Progress:
    """How a runner on ``backend`` sends progress: the backend's own way
    (``publish_progress``: a ``BaseBackend``, or a wrapper of one), else the process's
    hub, for watchers in this process."""
    publish = getattr(backend, "publish_progress", None)
    if callable(publish):
        return cast(Progress, publish)

    def to_hub(thread_id: str, node: str, revision: int, data: object) -> None:
        if HUB.listening(domain, thread_id):
            HUB.deliver(domain, thread_id, encode_progress(node, revision, data))

    return to_hub


def _typed(checkpointer: Checkpointer[S], state_type: Any) -> Checkpointer[S]:
    """The checkpointer decoding into ``state_type`` when it has no codec.

    A checkpointer without a codec and without ``with_codec`` (a 0.1 wrapper) hands back
    plain JSON: fine for a state type plain JSON already is (``dict[str, Any]``, a
    TypedDict, …), refused for one it cannot hand back (a dataclass, …). The codec is
    ``PydanticCodec`` for a pydantic model, else ``JSONCodec``."""
    if state_type is None:
        return checkpointer
    codec = codec_for_type(state_type)
    if isinstance(checkpointer, BaseCheckpointer):
        if checkpointer.codec is not None:
            return checkpointer
        return cast(Checkpointer[S], checkpointer.with_codec(codec))
    if getattr(checkpointer, "codec", None) is not None:
        return checkpointer
    with_codec = getattr(checkpointer, "with_codec", None)
    if with_codec is None and is_plain_json_type(state_type):
        return checkpointer
    if with_codec is None:
        raise TypeError(
            f"{type(checkpointer).__name__} has no codec, so it would hand this graph "
            f"plain JSON instead of {state_type!r}; give it "
            f"codec=flowy.storage.{type(codec).__name__}"
            f"({getattr(state_type, '__name__', '...')})"
        )
    return cast(Checkpointer[S], with_codec(codec))


def bind(backend: Backend[S], state_type: Any) -> Binding[S]:
    """Read ``backend``'s capabilities and components once, for a runner of a graph whose
    states are ``state_type`` (``None``: whatever the codec gives)."""
    caps = backend.capabilities
    cp = _typed(backend.checkpointer, state_type)
    leases = backend.leases if caps.run_leases else None
    outbox = backend.outbox if caps.handoff_outbox else None
    if isinstance(cp, BaseCheckpointer):
        base: BaseCheckpointer[S] | None = cp
        codec: StateCodec[Any] | None = cp.codec
        domain: Hashable = cp.domain
    else:
        base = None
        codec = getattr(cp, "codec", None)
        domain = getattr(cp, "domain", None)
    if domain is None:
        domain = id(backend.checkpointer)
    merge_codec = codec if base is not None else None
    merge: Merge | None = None
    if isinstance(merge_codec, JSONCodec):
        merge = cast(Merge, merge_codec.merge)
    elif merge_codec is not None:  # ``merge`` is optional on a codec (StateCodec)
        merge = getattr(merge_codec, "merge", None)
    durable = cast(DurableCheckpointer[S], cp) if caps.durable_timers_signals else None
    journal = cast(DurableCheckpointer[S], cp) if caps.journal else None
    guarded: Checkpointer[S] = cp
    if leases is not None and not caps.fencing:
        guarded = LeaseGuardCheckpointer(cp, leases)
    transactional = None
    if caps.transactional_outbox and outbox is not None:
        transactional = (
            cast(TransactionalCheckpointer[S], guarded),
            cast(TransactionalOutbox, outbox),
        )
    return Binding(
        backend=backend,
        capabilities=caps,
        checkpointer=guarded,
        leases=leases,
        outbox=outbox,
        transactional=transactional,
        durable=durable,
        journal=journal,
        codec=codec,
        merge_codec=merge_codec,
        merge=merge,
        limits=base.limits if base is not None else Limits(),
        domain=domain,
        progress=_progress_of(backend, domain),
        flush_progress=cast(
            "Callable[[], Awaitable[None]] | None", getattr(backend, "flush_progress", None)
        ),
    )
