"""Queues end to end: where a hand-off's message goes (``handoff(queue=...)``, a node's
and a graph's default), the workers that serve a queue, the limits a store keeps for
one seen from the runs, and a store without queues (``_directives.py``, ``_handoff.py``,
``_worker/_consume.py``)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from core_graphs import PlainOutbox, QueuelessConsumer, State, merge

import flowy
from flowy import types as ftypes
from flowy.cli._main import main
from flowy.memory import MemoryBackend
from flowy.queues import QueueLimits, Route, queues_of
from flowy.storage import as_backend
from flowy.testing.faults import FaultyOutbox

pytestmark = pytest.mark.anyio


def routed_graph(
    done: list[str] | None = None,
    *,
    node_queue: str | None = None,
    graph_queue: str | None = None,
    gate: Any = None,
) -> flowy.Graph[State, Any]:
    """work (hands off to 'finish' with the queue, partition and priority its state
    names, if any) → finish (records the thread in ``done``; runs ``gate`` if given)."""

    async def work(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"worked": True}, flowy.handoff(
            "background",
            resume_at="finish",
            queue=s.get("queue"),
            partition_key=s.get("customer"),
            priority=s.get("priority"),
        )

    async def finish(s: State) -> tuple[State, flowy.Directive[Any]]:
        if gate is not None:
            await gate(s)
        if done is not None:
            done.append(flowy.run_metadata().thread_id)
        return {"finished": True}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("work", work, queue=node_queue).add_node("finish", finish)
    b.add_edge("work", "finish").allow_no_outgoing_route("finish")
    return b.compile(queue=graph_queue)


async def queued(backend: Any, queue: str) -> list[str]:
    """The threads with a live message in ``queue``, in claim order."""
    return [m.intent.thread_id for m in await backend.queues.messages(queue) if m.intent]


# -- where a hand-off goes ----------------------------------------------------------------
async def test_the_directive_then_the_node_then_the_graph_then_default() -> None:
    async with await flowy.connect("memory://") as backend:
        plain = flowy.Runner(routed_graph(), backend)
        await plain.start("plain", {})
        await plain.start("named", {"queue": "llm"})
        by_node = flowy.Runner(routed_graph(node_queue="tools", graph_queue="slow"), backend)
        await by_node.start("node", {})
        await by_node.start("named-over-node", {"queue": "llm"})
        by_graph = flowy.Runner(routed_graph(graph_queue="slow"), backend)
        await by_graph.start("graph", {})
        assert await queued(backend, "default") == ["plain"]
        assert await queued(backend, "llm") == ["named", "named-over-node"]
        assert await queued(backend, "tools") == ["node"]
        assert await queued(backend, "slow") == ["graph"]
        # The hand-off's snapshot keeps its route, and the intent says the same.
        head, _ = await backend.checkpointer.load("named-over-node")
        assert head.route == Route("llm")
        (message,) = await backend.queues.messages("tools")
        assert message.intent is not None and message.intent.route == Route("tools")


async def test_partition_and_priority_come_from_the_state() -> None:
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(routed_graph(), backend)
        await runner.start("a", {"customer": "acme", "priority": 2})
        await runner.start("b", {"customer": "globex"})
        routes = {
            m.intent.thread_id: m.intent.route
            for m in await backend.queues.messages("default")
            if m.intent is not None
        }
        assert routes == {"a": Route("default", "acme", 2), "b": Route("default", "globex", 0)}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"queue": "has space"}, ValueError),
        ({"queue": ""}, ValueError),
        ({"queue": 3}, TypeError),
        ({"partition_key": "x" * 257}, ValueError),
        ({"priority": -1}, ValueError),
        ({"priority": 1.5}, TypeError),
    ],
)
def test_a_bad_route_is_refused_when_the_directive_is_made(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        flowy.handoff("x", **kwargs)


def test_a_bad_default_queue_is_refused_when_the_graph_is_built() -> None:
    async def node(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    with pytest.raises(ValueError, match="queue name 'no/slash'"):
        b.add_node("n", node, queue="no/slash")
    b.add_node("n", node).allow_no_outgoing_route("n")
    with pytest.raises(ValueError, match="queue name '-dash'"):
        b.compile(queue="-dash")
    graph = b.compile(queue="q1")
    assert graph.queue_of("n") == "q1" and graph.queues() == {"q1"}


# -- workers serve queues -----------------------------------------------------------------
async def test_a_worker_runs_only_the_queues_it_serves() -> None:
    done: list[str] = []
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(routed_graph(done), backend)
        for i in range(3):
            await runner.start(f"llm{i}", {"queue": "llm"})
            await runner.start(f"plain{i}", {})
        llm = flowy.Worker(runner, owner="llm", queues=("llm",))
        assert await llm.run_until_idle(idle_wait=0.05) == 3
        assert sorted(done) == ["llm0", "llm1", "llm2"]
        # The default queue's messages wait, untouched: never claimed, never buried.
        waiting = await backend.queues.messages("default")
        assert [m.intent.thread_id for m in waiting if m.intent] == ["plain0", "plain1", "plain2"]
        assert all(m.attempts == 0 for m in waiting)
        assert await backend.consumer.dead_letters() == []
        plain = flowy.Worker(runner, owner="plain")  # serves ("default",)
        assert plain.options.queues == ("default",)
        assert await plain.run_until_idle(idle_wait=0.05) == 3
        assert sorted(done) == [*(f"llm{i}" for i in range(3)), *(f"plain{i}" for i in range(3))]


async def test_a_global_limit_holds_across_two_workers() -> None:
    active = 0
    most = 0
    done: list[str] = []

    async def gate(s: State) -> None:
        nonlocal active, most
        active += 1
        most = max(most, active)
        for _ in range(5):  # stay in flight while the other worker claims
            await asyncio.sleep(0.01)
        active -= 1

    async with await flowy.connect("memory://") as backend:
        await backend.queues.configure("llm", global_concurrency=1)
        runner = flowy.Runner(routed_graph(done, gate=gate), backend)
        for i in range(6):
            await runner.start(f"t{i}", {"queue": "llm"})
        workers = [
            flowy.Worker(runner, owner=f"w{n}", queues=("llm",), concurrency=4) for n in (1, 2)
        ]
        await asyncio.gather(*(w.run_until_idle(idle_wait=0.3) for w in workers))
        assert sorted(done) == [f"t{i}" for i in range(6)]
        assert most == 1


async def test_one_run_per_partition_at_a_time() -> None:
    active: Counter[str] = Counter()
    most: Counter[str] = Counter()
    done: list[str] = []

    async def gate(s: State) -> None:
        customer = s["customer"]
        active[customer] += 1
        most[customer] = max(most[customer], active[customer])
        await asyncio.sleep(0.01)
        active[customer] -= 1

    async with await flowy.connect("memory://") as backend:
        await backend.queues.configure("default", partition_concurrency=1)
        runner = flowy.Runner(routed_graph(done, gate=gate), backend)
        for i in range(6):
            await runner.start(f"t{i}", {"customer": "acme" if i % 2 else "globex"})
        worker = flowy.Worker(runner, owner="w", concurrency=4)
        assert await worker.run_until_idle(idle_wait=0.05) == 6
        assert most == Counter({"acme": 1, "globex": 1})
        assert len(done) == 6


async def test_lower_priority_numbers_resume_first() -> None:
    done: list[str] = []
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(routed_graph(done), backend)
        for name, priority in [("p5", 5), ("p1", 1), ("p3", 3), ("p0a", 0), ("p0b", 0)]:
            await runner.start(name, {"priority": priority})
        worker = flowy.Worker(runner, owner="w", concurrency=1)
        assert await worker.run_until_idle(idle_wait=0.05) == 5
        assert done == ["p0a", "p0b", "p1", "p3", "p5"]


async def test_a_worker_takes_its_queues_in_turn() -> None:
    done: list[str] = []
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(routed_graph(done), backend)
        for i in range(3):
            await runner.start(f"a{i}", {"queue": "a"})
        for i in range(3):
            await runner.start(f"b{i}", {"queue": "b"})
        worker = flowy.Worker(runner, owner="w", queues=("a", "b"), concurrency=1)
        assert await worker.run_until_idle(idle_wait=0.05) == 6
        # A backlog in "a" does not keep "b" waiting: one of each, in turn.
        assert done == ["a0", "b0", "a1", "b1", "a2", "b2"]


async def test_worker_concurrency_counts_what_this_worker_holds() -> None:
    active = 0
    most = 0
    release, two_held, all_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    finished: list[State] = []

    async def gate(s: State) -> None:
        nonlocal active, most
        active += 1
        most = max(most, active)
        if active == 2:
            two_held.set()
        await release.wait()
        active -= 1
        finished.append(s)
        if len(finished) == 5:
            all_done.set()

    async with await flowy.connect("memory://") as backend:
        await backend.queues.configure("llm", worker_concurrency=2)
        runner = flowy.Runner(routed_graph(gate=gate), backend)
        for i in range(5):
            await runner.start(f"t{i}", {"queue": "llm"})
        worker = flowy.Worker(runner, owner="w", queues=("llm",), concurrency=8, poll_interval=0.02)
        task = asyncio.ensure_future(worker.run())
        await two_held.wait()
        for _ in range(10):  # several claims while two are held
            await asyncio.sleep(0.02)
        assert active == 2
        (stats,) = [q for q in await backend.queues.list() if q.queue == "llm"]
        assert stats.in_flight == 2 and stats.pending == 3
        release.set()
        await all_done.wait()
        worker.stop()
        await task
        assert most == 2
        assert worker.stats.outcomes["resumed"] == 5


async def test_a_signal_wakes_the_thread_through_the_graphs_queue() -> None:
    async def wait(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.wait_for("go", resume_at="after")

    async def after(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"woke": True}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("wait", wait).add_node("after", after).add_edge("wait", "after")
    b.allow_no_outgoing_route("after")
    async with await flowy.connect("memory://") as backend:
        runner = flowy.Runner(b.compile(queue="agents"), backend)
        await runner.start("t", {})
        await runner.signal("t", "go", {"n": 1})
        assert await queued(backend, "agents") == ["t"]
        assert await queued(backend, "default") == []
        worker = flowy.Worker(runner, owner="w", queues=("agents",), timer_interval=None)
        assert await worker.run_until_idle(idle_wait=0.05) == 1
        head, _ = await backend.checkpointer.load("t")
        assert head.status is flowy.RunStatus.COMPLETED


# -- recovery keeps the route -------------------------------------------------------------
async def test_a_recovered_orphaned_handoff_keeps_its_queue() -> None:
    mem: MemoryBackend[State] = MemoryBackend()
    outbox = FaultyOutbox(PlainOutbox(mem.outbox))  # three phases: pending, enqueued, message
    outbox.arm(error=lambda: ConnectionError("queue down"))
    backend = as_backend(mem.checkpointer, leases=mem.leases, outbox=outbox, consumer=mem.consumer)
    assert backend.capabilities.queues
    runner = flowy.Runner(routed_graph(node_queue="tools"), backend, run_lease=("fg", 5))
    r = await runner.start("t", {"customer": "acme", "priority": 4})
    assert r.reason == flowy.Reason.HANDOFF_ORPHANED
    head, _ = await mem.checkpointer.load("t")
    assert head.handoff_status is flowy.HandoffStatus.ORPHANED
    assert head.route == Route("tools", "acme", 4)
    queues = queues_of(backend)
    assert await queues.messages("tools") == []
    recovered = await runner.recover_stale_handoff("t")
    assert recovered.handoff_status is flowy.HandoffStatus.ENQUEUED
    (message,) = await queues.messages("tools")
    assert message.intent is not None and message.intent.route == Route("tools", "acme", 4)
    assert await queues.messages("default") == []
    worker = flowy.Worker(runner, owner="w", queues=("tools",))
    assert await worker.run_until_idle(idle_wait=0.05) == 1
    head, _ = await mem.checkpointer.load("t")
    assert head.status is flowy.RunStatus.COMPLETED


# -- a store without queues ---------------------------------------------------------------
def queueless() -> tuple[Any, MemoryBackend[State]]:
    mem: MemoryBackend[State] = MemoryBackend()
    consumer = QueuelessConsumer(mem.store)
    backend = as_backend(mem.checkpointer, leases=mem.leases, outbox=mem.outbox, consumer=consumer)
    assert not backend.capabilities.queues
    return backend, mem


async def test_a_handoff_to_a_queue_fails_clearly_on_a_store_without_queues() -> None:
    backend, mem = queueless()
    runner = flowy.Runner(routed_graph(), backend, run_lease=("fg", 5))
    r = await runner.start("t", {"queue": "llm"})
    assert r.status is flowy.RunStatus.FAILED
    assert r.reason == flowy.Reason.HANDOFF_QUEUE_UNSUPPORTED
    assert isinstance(r.error, TypeError)
    assert "'llm'" in str(r.error) and "ComponentBackend keeps none" in str(r.error)
    # Nothing is lost: the state is saved at the hand-off's node, and no message went
    # to the default queue in its place.
    head, _ = await mem.checkpointer.load("t")
    assert head.status is flowy.RunStatus.FAILED and head.execution_pointer == "finish"
    assert head.state == {"queue": "llm", "worked": True}
    assert mem.consumer.pending_count() == 0
    # A partition or a priority needs queues too; the default route does not.
    r = await runner.start("p", {"priority": 1})
    assert r.reason == flowy.Reason.HANDOFF_QUEUE_UNSUPPORTED
    r = await runner.start("plain", {})
    assert r.status is flowy.RunStatus.HANDOFF and mem.consumer.pending_count() == 1


async def test_a_graph_with_a_default_queue_is_refused_on_a_store_without_queues() -> None:
    backend, _ = queueless()
    with pytest.raises(TypeError, match=r"queue 'slow'.*keeps no queues"):
        flowy.Runner(routed_graph(graph_queue="slow"), backend)
    with pytest.raises(TypeError, match="queue 'tools'"):
        flowy.Runner(routed_graph(node_queue="tools"), backend)
    flowy.Runner(routed_graph(graph_queue="default"), backend)  # the default one is fine


async def test_a_worker_serves_only_the_default_queue_of_a_store_without_queues() -> None:
    backend, _ = queueless()
    runner = flowy.Runner(routed_graph(), backend, run_lease=("fg", 5))
    with pytest.raises(ValueError, match="keeps no queues"):
        flowy.Worker(runner, queues=("llm",))
    with pytest.raises(ValueError, match="keeps no queues"):
        flowy.Worker(runner, queues=("default", "llm"))
    await runner.start("t", {})
    assert await flowy.Worker(runner, owner="w").run_until_idle(idle_wait=0.05) == 1


def test_worker_queues_are_checked() -> None:
    assert ftypes.WorkerOptions(queues=["a", "b"]).queues == ("a", "b")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tuple of queue names"):
        ftypes.WorkerOptions(queues="llm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one queue"):
        ftypes.WorkerOptions(queues=())
    with pytest.raises(ValueError, match="twice"):
        ftypes.WorkerOptions(queues=("a", "a"))
    with pytest.raises(ValueError, match="queue name"):
        ftypes.WorkerOptions(queues=("a b",))


async def test_limits_of_a_queue_are_what_the_store_keeps() -> None:
    async with await flowy.connect("memory://") as backend:
        limits = await backend.queues.configure("llm", rate_limit=60, rate_period=60)
        assert limits == QueueLimits(rate_limit=60)


# -- the command line ---------------------------------------------------------------------
GRAPH_SPEC = "test_queues:routed_graph"


def flowy_cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str]:
    """``flowy ARGS --backend URL`` in this process (a memory:// store lives in it)."""
    capsys.readouterr()
    code = main([*args, "--backend", url, "--color", "never"])
    captured = capsys.readouterr()
    assert code == 0 or not captured.out, captured.out
    return code, captured.out + captured.err


async def started(url: str, threads: dict[str, State]) -> None:
    async with await flowy.connect(url) as backend:
        runner = flowy.Runner(routed_graph(), backend)
        for thread, state in threads.items():
            await runner.start(thread, state)


def test_flowy_queues_lists_sets_and_resets(capsys: pytest.CaptureFixture[str]) -> None:
    url = "memory://cli-queues"
    asyncio.run(started(url, {"a": {"queue": "llm"}, "b": {"queue": "llm"}, "c": {}}))
    code, text = flowy_cli(
        capsys, url, "queues", "set", "llm", "--global-concurrency", "2", "--rate-limit", "60"
    )
    assert (code, text.strip()) == (0, "queue llm: global 2, rate 60/60s")
    code, text = flowy_cli(capsys, url, "queues", "set", "llm", "--global-concurrency", "none")
    assert (code, text.strip()) == (0, "queue llm: rate 60/60s")
    code, text = flowy_cli(capsys, url, "queues")
    lines = text.splitlines()
    assert lines[0].split() == ["QUEUE", "IN", "FLIGHT", "PENDING", "OLDEST", "STARTED", "LIMITS"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["default"][1:3] == ["0", "1"] and rows["default"][4:] == ["-", "none"]
    assert rows["llm"][1:3] == ["0", "2"] and rows["llm"][4:] == ["0/60", "rate", "60/60s"]
    code, text = flowy_cli(capsys, url, "queues", "--json")
    listed = {q["queue"]: q for q in json.loads(text)}
    assert listed["llm"]["limits"]["rate_limit"] == 60 and listed["llm"]["pending"] == 2
    assert listed["llm"]["oldest_pending_age"] >= 0
    code, text = flowy_cli(capsys, url, "queues", "reset", "llm", "--json")
    assert json.loads(text)["limits"]["rate_limit"] is None

    async def limits() -> QueueLimits:
        async with await flowy.connect(url) as backend:
            return await backend.queues.limits("llm")

    assert asyncio.run(limits()) == QueueLimits()


def test_flowy_threads_queue_lists_the_threads_waiting_in_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "memory://cli-threads-queue"
    asyncio.run(
        started(
            url,
            {
                "late": {"queue": "llm", "priority": 3},
                "first": {"queue": "llm", "priority": 1, "customer": "acme"},
                "elsewhere": {},
            },
        )
    )
    code, text = flowy_cli(capsys, url, "threads", "--queue", "llm")
    lines = text.splitlines()
    assert code == 0 and lines[0].split()[:5] == [
        "THREAD",
        "STATUS",
        "POINTER",
        "PRIORITY",
        "PARTITION",
    ]
    assert [line.split()[:6] for line in lines[1:]] == [
        ["first", "handoff", "finish", "1", "acme", "0"],
        ["late", "handoff", "finish", "3", "-", "0"],
    ]
    code, text = flowy_cli(capsys, url, "threads", "--queue", "llm", "--json")
    assert [r["thread_id"] for r in json.loads(text)] == ["first", "late"]
    code, text = flowy_cli(capsys, url, "threads", "--queue", "idle")
    assert text.strip() == "no threads with a message in queue 'idle' of memory://cli-threads-queue"


def test_flowy_worker_serves_the_queues_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    url = "memory://cli-worker-queue"
    asyncio.run(started(url, {"a": {"queue": "llm"}, "b": {"queue": "tools"}, "c": {}}))
    code, text = flowy_cli(
        capsys, url, "worker", "--graph", GRAPH_SPEC, "--once", "--idle-wait", "0.05",
        "--owner", "w", "--queue", "llm", "--queue", "tools",
    )  # fmt: skip
    assert code == 0, text
    assert "· queues llm, tools" in text.splitlines()[0]
    assert text.splitlines()[-1] == "w: 2 message(s) processed (resumed 2)"
    code, text = flowy_cli(capsys, url, "threads", "--queue", "default", "--json")
    assert [r["thread_id"] for r in json.loads(text)] == ["c"]


async def test_a_handoff_inside_a_subgraph_takes_the_child_nodes_queue() -> None:
    child = routed_graph(node_queue="tools")
    inner = routed_graph()  # no queue of its own: the parent's default applies

    async def start(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    def parent(sub: flowy.Graph[State, Any]) -> flowy.Graph[State, Any]:
        b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
        b.add_node("start", start).add_subgraph("child", sub).add_edge("start", "child")
        b.allow_no_outgoing_route("child")
        return b.compile(queue="outer")

    async with await flowy.connect("memory://") as backend:
        await flowy.Runner(parent(child), backend).start("own", {})
        await flowy.Runner(parent(inner), backend).start("inherited", {})
        assert await queued(backend, "tools") == ["own"]
        assert await queued(backend, "outer") == ["inherited"]


async def test_a_branch_that_hands_off_sends_the_run_to_its_queue() -> None:
    async def split(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    async def quick(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {"quick": True}, flowy.completed()

    async def slow(s: State) -> tuple[State, flowy.Directive[Any]]:
        if s.get("resumed"):
            return {"slow": True}, flowy.completed()
        return {}, flowy.handoff("model call", priority=2)

    async def join(s: State) -> tuple[State, flowy.Directive[Any]]:
        return {}, flowy.completed()

    b: flowy.GraphBuilder[State, Any] = flowy.GraphBuilder(merge)
    b.add_node("split", split).add_node("quick", quick).add_node("slow", slow, queue="llm")
    b.add_node("join", join).add_parallel_edge("split", ["quick", "slow"], then="join")
    b.allow_no_outgoing_route("join")
    async with await flowy.connect("memory://") as backend:
        await flowy.Runner(b.compile(), backend).start("t", {})
        (message,) = await backend.queues.messages("llm")
        assert message.intent is not None and message.intent.route == Route("llm", "", 2)
