"""The inspector's fleet at a glance (``flowy ui``'s front page): counts of threads by
status and by node, each a link to the list filtered by it; the outbox backlog; and
the thread list, most recently saved first (to the second), filtered by id prefix,
status, node, graph version, queue (on a store with queues: the threads with a live
message in it) and age, a page at a time.

The list pages through the store's own recency cursor (``recent_threads``: an index of
each head's save second where the store keeps one, ``Capabilities.recent_index``); a
page reads the store's pages until it has :data:`PAGE_SIZE` threads that pass the
filters, or has read :data:`SCAN` heads, and its next-page link carries the cursor of
the last row (``SECOND~THREAD``), so a page stays stable while threads are saved. The
counts read the heads by id (``list_threads``), up to :data:`SCAN`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..queues import Queues
from ..storage import Checkpointer, DeadLetter, OutboxStats, RunStatus, ThreadSummary
from ..storage._recent import RecentCursor, cursor_text, parse_cursor, recent_key, recent_threads
from ._ui_html import e, href, relative, span, status_badge, table, thread_href

__all__ = [
    "AGES",
    "BadQueryError",
    "PAGE_SIZE",
    "SCAN",
    "Filters",
    "backlog",
    "counts",
    "filter_form",
    "listing",
    "parse_filters",
    "recent_page",
    "with_queue",
]

SCAN = 10_000
"""The most thread heads the front page reads to count, and to fill one page of the
list."""

_READ = 200
"""Heads per ``recent_threads`` call of one page of the list."""

PAGE_SIZE = 50
"""Threads on one page of the list."""

AGES: Mapping[str, tuple[str, float]] = {
    "": ("any age", 0.0),
    "-5m": ("saved in the last 5 min", -300.0),
    "-1h": ("saved in the last hour", -3600.0),
    "-1d": ("saved in the last day", -86400.0),
    "+1h": ("not saved for an hour", 3600.0),
    "+1d": ("not saved for a day", 86400.0),
    "+7d": ("not saved for 7 days", 7 * 86400.0),
}
"""The age filter's choices: a negative bound keeps threads saved since, a positive one
threads saved before, that many seconds ago."""


class BadQueryError(ValueError):
    """A page's query string that does not parse (the page answers 400)."""


@dataclass(frozen=True)
class Filters:
    """What the list shows: ``q`` an id prefix; the rest exact matches (empty: any)."""

    q: str = ""
    status: str = ""
    node: str = ""
    version: str = ""
    age: str = ""
    queue: str = ""
    before: RecentCursor | None = None
    queued: frozenset[str] = frozenset()
    """With ``queue``: the threads with a live message in it (:func:`with_queue`)."""

    def params(self, **change: str) -> dict[str, str]:
        """The query string of these filters (without the page), with ``change``."""
        base = {
            "q": self.q,
            "status": self.status,
            "node": self.node,
            "version": self.version,
            "queue": self.queue,
            "age": self.age,
        }
        return {**base, **change}

    def active(self) -> bool:
        return any((self.q, self.status, self.node, self.version, self.queue, self.age))

    def keep(self, s: ThreadSummary, now: float) -> bool:
        if self.q and not s.thread_id.startswith(self.q):
            return False
        if self.queue and s.thread_id not in self.queued:
            return False
        if self.status and s.status.value != self.status:
            return False
        if self.node and s.execution_pointer != self.node:
            return False
        if self.version and s.graph_version != self.version:
            return False
        bound = AGES.get(self.age, ("", 0.0))[1]
        if bound < 0 and s.updated_at < now + bound:
            return False
        return not (bound > 0 and s.updated_at > now - bound)


def parse_filters(query: Mapping[str, str]) -> Filters:
    """The filters of a request's query string; a malformed ``before`` or ``age`` is a
    :class:`BadQueryError` naming it."""
    age = query.get("age", "")
    if age not in AGES:
        raise BadQueryError(f"age must be one of {sorted(a for a in AGES if a)}, got {age[:40]!r}")
    before: RecentCursor | None = None
    if raw := query.get("before", ""):
        try:
            before = parse_cursor(raw)
        except ValueError:  # InvalidThreadIdError too
            raise BadQueryError(
                f"before must be SECOND~THREAD from a next-page link, got {raw[:60]!r}"
            ) from None
    return Filters(
        q=query.get("q", ""),
        status=query.get("status", ""),
        node=query.get("node", ""),
        version=query.get("version", ""),
        queue=query.get("queue", ""),
        age=age,
        before=before,
    )


async def with_queue(filters: Filters, queues: Queues | None) -> Filters:
    """``filters`` with the threads that have a live message in ``filters.queue`` (up to
    :data:`SCAN` messages), read from ``queues`` (``None``: a store without queues,
    where a queue filter is a :class:`BadQueryError`)."""
    if not filters.queue:
        return filters
    if queues is None:
        raise BadQueryError("this store keeps no queues: drop the queue filter")
    try:
        messages = await queues.messages(filters.queue, SCAN)
    except ValueError as exc:  # a malformed queue name
        raise BadQueryError(str(exc)) from None
    queued = frozenset(m.intent.thread_id for m in messages if m.intent is not None)
    return replace(filters, queued=queued)


def counts(rows: Sequence[ThreadSummary], filters: Filters) -> str:
    """Cards: the threads by status and by node, each a link to the list of them."""
    statuses = Counter(s.status.value for s in rows)
    nodes = Counter(s.execution_pointer for s in rows)

    def card(label: str, n: int, link: str, on: bool, cls: str = "") -> str:
        mark = " on" if on else ""
        return (
            f"<a class='card{mark}' href='{link}'><b class='count'>{n}</b>"
            f"<span class='{cls}'>{e(label)}</span></a>"
        )

    every = card("all threads", len(rows), href("/"), not filters.active())
    by_status = "".join(
        card(v, statuses[v], href("/", status=v), filters.status == v, f"st-{v}")
        for v in (s.value for s in RunStatus)
        if statuses[v]
    )
    by_node = "".join(
        card(n, c, href("/", node=n), filters.node == n)
        for n, c in sorted(nodes.items(), key=lambda nc: (-nc[1], nc[0]))
    )
    return (
        f"<h2>By status</h2><div class='cards' id='by-status'>{every}{by_status}</div>"
        f"<h2>By node</h2><div class='cards' id='by-node'>{by_node or ''}</div>"
    )


def backlog(stats: OutboxStats | None, oldest: Mapping[RunStatus, float], now: float) -> str:
    """The outbox backlog gauges and how long the oldest parked threads have waited."""
    cards: list[str] = []
    if stats is not None:
        oldest_pending = (
            "-" if stats.oldest_pending_at is None else span(now - stats.oldest_pending_at)
        )
        # A gauge that fills up over an hour of waiting: a backlog that old needs a look.
        age = 0.0 if stats.oldest_pending_at is None else now - stats.oldest_pending_at
        cards += [
            f"<div class='card' id='outbox-pending'><b class='count'>{stats.pending}</b>"
            "outbox pending</div>",
            f"<div class='card' id='outbox-oldest'><b class='count'>{e(oldest_pending)}</b>"
            f"oldest pending <meter min='0' max='3600' high='600' value='{min(age, 3600):.0f}'>"
            "</meter></div>",
            f"<div class='card' id='outbox-dead'><b class='count'>{stats.dead_letters}</b>"
            f"<a href='/dead-letters'>dead letters</a></div>",
        ]
    for status in (RunStatus.SUSPENDED, RunStatus.WAITING):
        if status in oldest:
            cards.append(
                f"<div class='card'><b class='count'>{e(span(now - oldest[status]))}</b>"
                f"oldest {e(status.value)}</div>"
            )
    if not cards:
        return ""
    return f"<h2>Backlog</h2><div class='cards' id='backlog'>{''.join(cards)}</div>"


def filter_form(
    rows: Sequence[ThreadSummary], filters: Filters, queue_names: Sequence[str] | None = None
) -> str:
    """The search and filter form (a GET, so a filtered list is a link); a queue select
    when the store keeps queues (``queue_names``, else ``None``)."""

    def select(name: str, current: str, choices: Sequence[tuple[str, str]]) -> str:
        options = "".join(
            f"<option value='{e(v)}'{' selected' if v == current else ''}>{e(label)}</option>"
            for v, label in choices
        )
        return f"<select name='{name}' id='f-{name}'>{options}</select>"

    nodes = sorted({s.execution_pointer for s in rows} | ({filters.node} - {""}))
    versions = sorted({s.graph_version for s in rows if s.graph_version})
    statuses = [("", "any"), *((s.value, s.value) for s in RunStatus)]
    queue_select = ""
    if queue_names is not None:
        names = sorted({*queue_names, *({filters.queue} - {""})})
        choices = [("", "any"), *((n, n) for n in names)]
        queue_select = f"<label>queue {select('queue', filters.queue, choices)}</label>"
    return (
        "<form method='get' action='/' class='filters' id='filters'>"
        f"<label>thread id starts with <input name='q' id='f-q' value='{e(filters.q)}' "
        "size='16'></label>"
        f"<label>status {select('status', filters.status, statuses)}</label>"
        f"<label>node {select('node', filters.node, [('', 'any'), *((n, n) for n in nodes)])}"
        "</label>"
        f"<label>graph version "
        f"{select('version', filters.version, [('', 'any'), *((v, v[:24]) for v in versions)])}"
        "</label>"
        + queue_select
        + f"<label>age {select('age', filters.age, [(k, v[0]) for k, v in AGES.items()])}</label>"
        "<button type='submit'>Filter</button> <a href='/'>clear</a></form>"
    )


async def recent_page(
    checkpointer: Checkpointer[Any], filters: Filters, now: float
) -> tuple[list[ThreadSummary], RecentCursor | None]:
    """One page of the list: up to :data:`PAGE_SIZE` threads that pass ``filters``,
    most recently saved first, below ``filters.before``, read through the store's
    recency cursor; and the cursor of the next page (``None``: no more)."""
    shown: list[ThreadSummary] = []
    before, read = filters.before, 0
    bound = AGES.get(filters.age, ("", 0.0))[1]
    while read < SCAN:
        page = await recent_threads(checkpointer, limit=_READ, before=before)
        read += len(page)
        for s in page:
            if bound < 0 and s.updated_at < now + bound - 1:
                return shown, None  # the rest were saved before the age asked for
            if filters.keep(s, now):
                if len(shown) == PAGE_SIZE:
                    return shown, recent_key(shown[-1])
                shown.append(s)
        if len(page) < _READ:
            return shown, None
        before = recent_key(page[-1])
    return shown, before  # SCAN heads read: the next page goes on from there


def listing(
    rows: Sequence[ThreadSummary],
    shown: Sequence[ThreadSummary],
    following: RecentCursor | None,
    filters: Filters,
    dead: Mapping[str, Sequence[DeadLetter]],
    now: float,
    truncated: bool,
) -> str:
    """One page of the threads that pass ``filters`` (``shown``, from
    :func:`recent_page`), with a link to the next page (``following``); ``rows`` are
    the heads counted, for the page's place among them."""
    body = table(
        ["thread", "status", "reason", "node", "revision", "hand-off", "updated"],
        (
            [
                f"<a href='{thread_href(s.thread_id)}'>{e(s.thread_id)}</a>",
                status_badge(s.status.value),
                e(s.reason),
                e(s.execution_pointer),
                e(s.revision),
                e(s.handoff_status.value)
                + (" <strong>(dead letter)</strong>" if s.thread_id in dead else ""),
                relative(s.updated_at, now),
            ]
            for s in shown
        ),
        "no threads" + (" match" if filters.active() else ""),
        nums=(4,),
        ident="threads",
    )
    matching = [s for s in rows if filters.keep(s, now)]
    cursor = filters.before
    offset = 0 if cursor is None else sum(recent_key(s) >= cursor for s in matching)
    total = "" if truncated else f" of {max(len(matching), offset + len(shown))}"
    where = f"{offset + 1}–{offset + len(shown)}{total}" if shown else ""
    pager = [f"<span class='muted' id='shown'>{e(where)}</span>"]
    if cursor is not None:
        pager.append(f"<a href='{href('/', **filters.params())}' id='first'>first page</a>")
    if following is not None:
        link = href("/", **filters.params(before=cursor_text(following)))
        pager.append(f"<a href='{link}' id='next'>next page →</a>")
    note = (
        f"<p class='muted'><em>only the first {SCAN} threads by id are counted</em></p>"
        if truncated
        else ""
    )
    return body + f"<div class='pager'>{''.join(pager)}</div>" + note
