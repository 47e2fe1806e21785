"""``FlowySaver``: LangGraph's ``BaseCheckpointSaver`` over any ``flowy.Backend``.

Where things go, through the store's public primitives only:

- each LangGraph thread and checkpoint namespace is one flowy thread (its *address*,
  ``langgraph`` + thread id + namespace, separated by U+001E);
- each LangGraph checkpoint is one save on that flowy thread (strict OCC: the revision
  read is the revision written over), so a thread's history is its checkpoints in the
  order they were put, the head the latest;
- the pending writes of a checkpoint are the activity journal of a flowy thread of their
  own (the address and the checkpoint id), which has no snapshot: one entry per write,
  keyed by task id and write index (a second put of the same key replaces it), deleted
  with the checkpoint (``keep_last``, ``prune``, ``delete_thread``, ``delete_for_runs``).

Checkpoints, metadata and written values are encoded with the saver's ``serde``
(LangGraph's own serializer) and stored base64 in a JSON state, so nothing stored is
ever unpickled. No SQL, no keys, nothing of one store: a new flowy store gets this
saver for free.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from flowy.errors import ConcurrencyConflictError, ThreadNotFoundError
from flowy.storage import (
    ActivityRecord,
    ActivityStatus,
    Backend,
    DurableCheckpointer,
    JSONCodec,
    Snapshot,
    connect,
    redact_url,
)

__all__ = ["FlowySaver", "ThreadForkedError"]

_PREFIX = "langgraph\x1e"
_SEP = "\x1e"
_PAGE = 500
_ALL = 1_000_000  # "every history entry": a keep_last saver keeps a handful
_REMEMBERED = 10_000  # threads whose last written head a saver remembers


class ThreadForkedError(ConcurrencyConflictError):
    """A fenced ``FlowySaver`` refused a checkpoint whose parent is not the thread's
    latest checkpoint: another writer moved the thread on since this one read it."""


def _escape(text: str) -> str:
    # Backslashes doubled first, so "\\1" only ever stands for an escaped separator.
    return text.replace("\\", "\\\\").replace(_SEP, "\\1")


def _unescape(text: str) -> str:
    out: list[str] = []
    chars = iter(text)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, "")
            out.append(_SEP if nxt == "1" else nxt)
        else:
            out.append(ch)
    return "".join(out)


def _address(thread_id: str, checkpoint_ns: str) -> str:
    return f"{_PREFIX}{_escape(thread_id)}{_SEP}{_escape(checkpoint_ns)}"


def _split(address: str) -> tuple[str, str]:
    thread, ns = address[len(_PREFIX) :].split(_SEP, 1)
    return _unescape(thread), _unescape(ns)


def _where(config: RunnableConfig) -> tuple[str, str, str | None]:
    """The thread id, checkpoint namespace and checkpoint id (if any) ``config`` names."""
    configurable: dict[str, Any] = dict(config.get("configurable") or {})
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise ValueError(
            "the config has no configurable thread_id; pass "
            "{'configurable': {'thread_id': ...}} to the graph"
        )
    checkpoint_id = configurable.get("checkpoint_id")
    return str(thread_id), str(configurable.get("checkpoint_ns") or ""), checkpoint_id or None


def _writes_address(address: str, checkpoint_id: str) -> str:
    """The flowy thread whose journal holds the pending writes of ``checkpoint_id``."""
    return f"{address}{_SEP}{checkpoint_id}"


def _write_key(task_id: str, idx: int) -> str:
    return f"{task_id}{_SEP}{idx}"


class FlowySaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on a flowy store: memory, SQLite, PostgreSQL, Redis or
    DynamoDB, whichever ``backend`` is.

    The async methods are native; the sync ones (``get_tuple``, ``put``, …) run them on
    the event loop the saver was made on, from another thread, as LangGraph's own async
    savers do.

    Args:
        backend: an open flowy store (``await flowy.connect(url)``); it needs the
            activity journal (every store flowy ships has it). The saver does not
            close it; ``FlowySaver.from_url`` opens and closes one.
        fenced: refuse a checkpoint whose parent is not the thread's latest checkpoint
            (``ThreadForkedError``), checked atomically with the write: a second
            concurrent writer on a thread fails instead of silently forking its
            history. This also refuses deliberate forks (replaying from an older
            checkpoint, ``update_state`` on one), so leave it off where those are used.
        keep_last: keep only the newest ``keep_last`` checkpoints of each thread and
            namespace, pruned as checkpoints are written (``None``: keep all).
        serde: LangGraph's serializer for checkpoints, metadata and writes (default:
            LangGraph's ``JsonPlusSerializer``).
    """

    def __init__(
        self,
        backend: Backend[Any],
        *,
        fenced: bool = False,
        keep_last: int | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        retain = cast(object, keep_last)
        if retain is not None and (
            isinstance(retain, bool) or not isinstance(retain, int) or retain < 1
        ):
            raise ValueError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        if not backend.capabilities.journal:
            raise TypeError(
                f"{type(backend).__name__} has no activity journal, where FlowySaver keeps "
                "pending writes; use a store that has one (every store flowy ships does)"
            )
        codec = backend.checkpointer.codec
        if codec is not None and not (isinstance(codec, JSONCodec) and codec.state_type is None):
            raise TypeError(
                f"FlowySaver stores plain JSON states, but {redact_url(backend.url)!r} was "
                f"opened with the state codec {codec!r}; open the store without a codec "
                "(flowy.connect(url)) for the saver"
            )
        super().__init__(serde=serde)
        self.backend = backend
        self.fenced = fenced
        self.keep_last = keep_last
        self._store = cast(DurableCheckpointer[Any], backend.checkpointer)
        self._heads: dict[str, tuple[int, str, list[str]]] = {}
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    @classmethod
    @asynccontextmanager
    async def from_url(
        cls,
        url: str,
        *,
        fenced: bool = False,
        keep_last: int | None = None,
        serde: SerializerProtocol | None = None,
    ) -> AsyncGenerator[FlowySaver]:
        """Open the flowy store at ``url`` (as ``flowy.connect`` takes it) and yield a
        saver on it; the store is closed on exit.

        ::

            async with FlowySaver.from_url("sqlite:///agent.db") as saver:
                graph = builder.compile(checkpointer=saver)
        """
        async with connect(url) as backend:
            yield cls(backend, fenced=fenced, keep_last=keep_last, serde=serde)

    # -- encoding ---------------------------------------------------------------

    def _dump(self, value: object) -> list[str]:
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode("ascii")]

    def _load(self, stored: object) -> Any:
        kind, data = cast(list[str], stored)
        return self.serde.loads_typed((kind, base64.b64decode(data)))

    def _tuple(
        self, address: str, state: dict[str, Any], writes: list[dict[str, Any]]
    ) -> CheckpointTuple:
        thread_id, ns = _split(address)
        checkpoint_id = state["id"]
        parent = state.get("parent")
        mine = sorted(writes, key=lambda w: (w.get("path", ""), w["task"], w["idx"]))
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }
            },
            checkpoint=self._load(state["checkpoint"]),
            metadata=self._load(state["metadata"]),
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": parent,
                    }
                }
                if parent
                else None
            ),
            pending_writes=[(w["task"], w["channel"], self._load(w["value"])) for w in mine],
        )

    async def _writes(self, address: str, checkpoint_id: str) -> list[dict[str, Any]]:
        """The pending writes of ``checkpoint_id`` stored at ``address``."""
        journal = await self._store.journal(_writes_address(address, checkpoint_id))
        return [cast(dict[str, Any], record.result) for record in journal]

    async def _drop(self, address: str, checkpoint_ids: Sequence[str]) -> None:
        """Delete the pending writes of ``checkpoint_ids`` stored at ``address``."""
        await asyncio.gather(
            *(self._store.delete(_writes_address(address, c)) for c in checkpoint_ids)
        )

    async def _head(self, address: str) -> tuple[dict[str, Any] | None, int]:
        try:
            snapshot, revision = await self._store.load(address)
        except ThreadNotFoundError:
            return None, 0
        return cast(dict[str, Any], snapshot.state), revision

    async def _history(self, address: str) -> list[dict[str, Any]]:
        """Every checkpoint stored at ``address``, newest first."""
        return [cast(dict[str, Any], s.state) for s in await self._store.get_history(address, _ALL)]

    async def _addresses(self, thread_id: str | None) -> list[str]:
        """The flowy threads of ``thread_id`` (all namespaces), or of every thread."""
        prefix = _PREFIX if thread_id is None else f"{_PREFIX}{_escape(thread_id)}{_SEP}"
        after: str | None = prefix[:-1]
        found: list[str] = []
        while True:
            page = await self._store.list_threads(limit=_PAGE, after=after)
            for summary in page:
                if summary.thread_id.startswith(prefix):
                    found.append(summary.thread_id)
                elif summary.thread_id > prefix:
                    return found
            if len(page) < _PAGE:
                return found
            after = page[-1].thread_id

    # -- the saver --------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), or the latest of its
        thread and namespace; ``None`` if there is none."""
        thread_id, ns, wanted = _where(config)
        address = _address(thread_id, ns)
        if wanted:
            (head, _), writes = await asyncio.gather(
                self._head(address), self._writes(address, wanted)
            )
        else:
            head, _ = await self._head(address)
            writes = None
        if head is None:
            return None
        if wanted and head["id"] != wanted:
            found = [s for s in await self._history(address) if s["id"] == wanted]
            if not found:
                return None
            head = found[0]
        if writes is None:
            writes = await self._writes(address, head["id"])
        return self._tuple(address, head, writes)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first: of ``config``'s thread (and namespace, if it names
        one; and only its ``checkpoint_id``, if it names one), or of every thread; only
        those whose metadata has every key and value of ``filter``, older than
        ``before``, at most ``limit``."""
        configurable = (config or {}).get("configurable") or {}
        thread_id = configurable.get("thread_id")
        addresses = await self._addresses(None if thread_id is None else str(thread_id))
        ns = configurable.get("checkpoint_ns")
        if ns is not None:
            addresses = [a for a in addresses if _split(a)[1] == ns]
        wanted = configurable.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        found: list[tuple[str, str, dict[str, Any]]] = []
        for address in addresses:
            for state in await self._history(address):
                if wanted and state["id"] != wanted:
                    continue
                if before_id and state["id"] >= before_id:
                    continue
                found.append((state["id"], address, state))
        found.sort(key=lambda item: item[0], reverse=True)
        count = 0
        for _, address, state in found:
            if limit is not None and count >= limit:
                return
            if filter:
                metadata = self._load(state["metadata"])
                if not all(k in metadata and metadata[k] == v for k, v in filter.items()):
                    continue
            count += 1
            yield self._tuple(address, state, await self._writes(address, state["id"]))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` as the latest of its thread and namespace, child of the
        ``checkpoint_id`` in ``config``. Fenced, a parent that is not the latest
        checkpoint raises ``ThreadForkedError`` and stores nothing."""
        thread_id, ns, parent = _where(config)
        address = _address(thread_id, ns)
        state: dict[str, Any] = {
            "id": checkpoint["id"],
            "parent": parent,
            "checkpoint": self._dump(checkpoint),
            "metadata": self._dump(get_checkpoint_metadata(config, metadata)),
        }
        snapshot = Snapshot(
            thread_id=address,
            state=state,
            execution_pointer=checkpoint["id"],
            updated_at=time.time(),
        )
        # The head this saver wrote last, if the new checkpoint follows it, saves a read;
        # the save's revision check still decides (a conflict reads the head).
        known = self._heads.get(address)
        revision, recent = (known[0], known[2]) if known and known[1] == parent else (None, [])
        while True:
            if revision is None:
                head, revision = await self._head(address)
                if self.fenced and (head["id"] if head else None) != parent:
                    raise self._forked(thread_id, ns, parent, head)
                recent = list(head.get("recent", [])) if head else []
            # With keep_last, each checkpoint names the newest ones kept before it: what
            # falls out of that window is pruned, and its writes deleted, without a read.
            kept = [checkpoint["id"], *recent][: self.keep_last] if self.keep_last else []
            state["recent"] = kept
            try:
                revision = await self._store.save(revision, snapshot)
                break
            except ConcurrencyConflictError as exc:
                if self.fenced:
                    raise self._forked(thread_id, ns, parent, None) from exc
                # Unfenced, like LangGraph's own savers: the later writer also succeeds.
                revision = None
        if len(self._heads) >= _REMEMBERED:
            self._heads.clear()
        self._heads[address] = (revision, checkpoint["id"], kept)
        if self.keep_last is not None and revision > self.keep_last:
            dropped = [c for c in recent if c not in kept]
            await asyncio.gather(
                self._store.prune(address, self.keep_last), self._drop(address, dropped)
            )
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    @staticmethod
    def _forked(
        thread_id: str, ns: str, parent: str | None, head: dict[str, Any] | None
    ) -> ThreadForkedError:
        latest = f"its latest is {head['id']!r}" if head else "another writer got there first"
        where = f"thread {thread_id!r}" + (f" namespace {ns!r}" if ns else "")
        return ThreadForkedError(
            f"{where} moved on since this run read it: the new checkpoint's parent is "
            f"{parent!r} but {latest}; two runs are writing the thread at once (fenced "
            "FlowySaver refuses the fork). Run it again from the latest checkpoint."
        )

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store the writes of task ``task_id`` against the checkpoint ``config`` names;
        writing the same task and index again replaces the write."""
        thread_id, ns, checkpoint_id = _where(config)
        if checkpoint_id is None:
            raise ValueError(
                "put_writes needs the config of a stored checkpoint (with its "
                f"checkpoint_id); got {config!r:.200}"
            )
        address = _address(thread_id, ns)
        now = time.time()
        records = [
            ActivityRecord(
                key=_write_key(task_id, idx),
                status=ActivityStatus.SUCCEEDED,
                name=channel,
                result={
                    "checkpoint": checkpoint_id,
                    "task": task_id,
                    "path": task_path,
                    "idx": idx,
                    "channel": channel,
                    "value": cast(Any, self._dump(value)),
                },
                started_at=now,
                updated_at=now,
            )
            for i, (channel, value) in enumerate(writes)
            for idx in (WRITES_IDX_MAP.get(channel, i),)
        ]
        where = _writes_address(address, checkpoint_id)
        await asyncio.gather(*(self._store.put_activity(where, r) for r in records))

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of ``thread_id``, in every namespace."""
        for address in await self._addresses(str(thread_id)):
            self._heads.pop(address, None)
            await self._drop(address, [s["id"] for s in await self._history(address)])
            await self._store.delete(address)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of ``source_thread_id`` to
        ``target_thread_id``, in order, after the target's own."""
        for address in await self._addresses(str(source_thread_id)):
            _, ns = _split(address)
            target = _address(str(target_thread_id), ns)
            self._heads.pop(target, None)
            history = list(reversed(await self._history(address)))
            await self._append(target, history)
            for state in history:
                await self._copy_writes(address, target, state["id"])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint whose metadata ``run_id`` is in ``run_ids``, with its
        writes. A thread that has some is rewritten without them (not atomically: a
        crash in the middle can lose that thread's other checkpoints)."""
        runs = {str(r) for r in run_ids}
        if not runs:
            return
        for address in await self._addresses(None):
            history = await self._history(address)
            keep = [s for s in history if self._load(s["metadata"]).get("run_id") not in runs]
            if len(keep) == len(history):
                continue
            self._heads.pop(address, None)
            await self._store.delete(address)
            await self._append(address, list(reversed(keep)))
            await self._drop(address, [s["id"] for s in history if s not in keep])

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep only the latest checkpoint of each namespace of each
        thread, with its writes; ``delete``: delete the threads."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                await self.adelete_thread(thread_id)
                continue
            for address in await self._addresses(str(thread_id)):
                older = [s["id"] for s in await self._history(address)][1:]
                await self._store.prune(address, 1)
                await self._drop(address, older)

    async def _append(self, address: str, states: list[dict[str, Any]]) -> None:
        _, revision = await self._head(address)
        for state in states:
            snapshot = Snapshot(
                thread_id=address,
                state=state,
                execution_pointer=state["id"],
                updated_at=time.time(),
            )
            revision = await self._store.save(revision, snapshot)

    async def _copy_writes(self, source: str, target: str, checkpoint_id: str) -> None:
        where = _writes_address(target, checkpoint_id)
        journal = await self._store.journal(_writes_address(source, checkpoint_id))
        await asyncio.gather(*(self._store.put_activity(where, record) for record in journal))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A channel version after ``current``: zero-padded so versions order as
        strings, as LangGraph's own database savers make them."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{time.time_ns() % 1_000_000:016}"

    # -- sync methods, as LangGraph's async savers provide them -------------------

    def _run(self, coro: Any) -> Any:
        if self.loop is None:
            coro.close()
            raise asyncio.InvalidStateError(
                "FlowySaver was made outside an event loop, so its sync methods have no "
                "loop to run on; make it inside one, or use the async methods"
            )
        try:
            if asyncio.get_running_loop() is self.loop:
                coro.close()
                raise asyncio.InvalidStateError(
                    "sync calls to FlowySaver are only allowed from another thread than "
                    "its event loop's; there, use the async interface (await "
                    "saver.aget_tuple(...), await graph.ainvoke(...))"
                )
        except RuntimeError:
            pass
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``aget_tuple`` from another thread."""
        return self._run(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """``alist`` from another thread."""

        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._run(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """``aput`` from another thread."""
        return self._run(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """``aput_writes`` from another thread."""
        self._run(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """``adelete_thread`` from another thread."""
        self._run(self.adelete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """``acopy_thread`` from another thread."""
        self._run(self.acopy_thread(source_thread_id, target_thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """``adelete_for_runs`` from another thread."""
        self._run(self.adelete_for_runs(run_ids))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``aprune`` from another thread."""
        self._run(self.aprune(thread_ids, strategy=strategy))
