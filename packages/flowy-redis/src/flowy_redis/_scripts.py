"""The Lua scripts: every change of the store is one script, run with EVALSHA.

Each script reads the clock with ``redis.call('TIME')`` (the server's clock, never the
client's), declares every key it touches in ``KEYS`` (all of one hash slot, except the
standalone-only multi-shard reads), and is idempotent under a resend of the same call (a
driver that retries after a timeout): a save whose exact record is already the head at
the new revision answers with that revision, and lease calls carry a nonce. Why each
keeps what it keeps: the README ("What is atomic, and how", "Leases and their clock",
"Outbox and consumers"). The functions scripts share are written once, in
``_lua.LIBRARY``, and each script is composed with those it calls (``LuaScript``).
"""

from __future__ import annotations

from ._lua import LuaScript as LuaScript

__all__ = [
    "ACK",
    "ACQUIRE",
    "ACQUIRE_HEAD",
    "ACTIVITY",
    "APPEND",
    "CLAIM",
    "DEAD_LIST",
    "DELETE",
    "HEAD_COLUMNS",
    "HEADS",
    "HISTORY",
    "HOLDER",
    "LAYOUT",
    "LIST",
    "PRUNE",
    "QUEUE_COUNTS",
    "RECENT",
    "RECENT_FILL",
    "RECENT_HEADS",
    "QUEUE_MESSAGES",
    "RELEASE",
    "RELEASED_TTL_MS",
    "RELEASE_MESSAGE",
    "READS",
    "RENEW",
    "RETRY_DEAD",
    "SIGNAL",
    "SIGNALS",
    "STATS",
    "TIMERS",
    "LuaScript",
    "save_script",
]

RELEASED_TTL_MS = 10_000
"""How long the tombstone of a released lease lives (a resent release finds it)."""

HEAD_COLUMNS = (
    "pointer",
    "status",
    "reason",
    "handoff_status",
    "handoff_pending_at",
    "updated_at",
    "wake_at",
    "graph_version",
)
"""The head hash's columns after ``revision``, in the order the save script takes them
and ``HEADS`` returns them ('' for no hand-off pending and no wake-up time)."""

_SAVE = """
-- KEYS: head, hist, lease, threads, exp, timers, inbox, sigids, journal [, the shard's 7
--       outbox keys].
-- ARGV: expected, record, replay ('1': an identical record at the new revision is this
--       very save, resent), lease owner, lease token ('' without a lease), thread id,
--       the head's columns (HEAD_COLUMNS, from ARGV[7]), then (key, payload, queue,
--       priority, partition key) per outbox row.
-- Returns the new revision, or {actual revision[, owner, token, exp of the live lease]}.
local TTL = @TTL@
local expected, id = tonumber(ARGV[1]), ARGV[6]
local status, handoff, wake = ARGV[8], ARGV[10], ARGV[13]
local h = redis.call('HMGET', KEYS[1], 'revision', 'handoff_status', 'status', 'wake_at'@OLD@)
local cur = tonumber(h[1]) or 0
if cur == expected + 1 and ARGV[3] == '1' and redis.call('HGET', KEYS[2], cur) == ARGV[2] then
  return cur
end
local now = now_us()
local l, live = live_lease(KEYS[3], now)
if cur ~= expected or not fenced(l, live, ARGV[4], ARGV[5]) then
  if live then return {cur, l[1], l[2], l[3]} end
  return {cur}
end
local rev = cur + 1
redis.call('HSET', KEYS[1], 'revision', rev, @COLUMNS@)
-- The timer index (a new thread may find the member of an expired one).
if cur == 0 or (h[4] or '') ~= wake then
  if wake == '' then
    redis.call('ZREM', KEYS[6], id)
  else
    redis.call('ZADD', KEYS[6], wake, id)
  end
end
if cur == 0 or h[2] ~= handoff then
  if cur == 0 then
    redis.call('HSET', KEYS[1], 'oldest', rev)
    redis.call('ZREM', KEYS[4], '0' .. id, '1' .. id, '2' .. id, '3' .. id)
  else
    redis.call('ZREM', KEYS[4], (DIGIT[h[2]] or '0') .. id)
  end
  redis.call('ZADD', KEYS[4], 0, DIGIT[handoff] .. id)
end
@RECENT@redis.call('HSET', KEYS[2], rev, ARGV[2])
if TTL > 0 and (status == 'completed' or status == 'failed') then
  for _, i in ipairs({1, 2, 7, 8, 9}) do redis.call('PEXPIRE', KEYS[i], TTL) end
  local ms = math.floor(now / 1000)
  redis.call('ZADD', KEYS[5], ms + TTL, id)
  -- Forget a few threads whose keys expired (bounded work per save).
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', ms, 'LIMIT', 0, 16)) do
    forget(KEYS[4], KEYS[5], KEYS[6], gone)@FORGET@
  end
elseif cur == 0 or h[3] == 'completed' or h[3] == 'failed' then
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
  -- An inbox or journal expiring while there is no head belonged to an expired thread.
  if cur > 0 then
    for i = 7, 9 do redis.call('PERSIST', KEYS[i]) end
  end
  redis.call('ZREM', KEYS[5], id)
end
@RELEASE@
if #ARGV > @FIXED@ then
  local k = outbox_keys(@OUTBOX@)
  for i = @ROW@, #ARGV, 5 do
    append(k, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
  end
end
return rev
""".replace("@COLUMNS@", ", ".join(f"'{c}', ARGV[{i}]" for i, c in enumerate(HEAD_COLUMNS, 7)))


_SAVE_RECENT = """-- The recency index (KEYS[10]): the head's save second, written only when it
-- differs from the second of the head before, so the saves of a run within one second
-- skip it.
local second = math.floor(tonumber(ARGV[12]))
if cur == 0 or math.floor(tonumber(h[5]) or -1) ~= second then
  redis.call('ZADD', KEYS[10], second, id)
end
"""

_SAVE_RELEASE = """
-- The lease (fenced above) is released: its record becomes a tombstone that expires soon.
redis.call('HSET', KEYS[3], 'exp', '0')
expire_after(KEYS[3], now + @RELEASED@ * 1000, l[2])
""".replace("@RELEASED@", str(RELEASED_TTL_MS))


_SAVE_ACK = """
-- The acking save also acknowledges the hand-off message its run was resumed for, as
-- ACK does (one already gone is no refusal). Its ARGV[15..17] are the group, the message
-- id and the prefix of the queues' keys (the outbox rows follow), and its last 7 KEYS
-- are the outbox keys of the message's shard.
acknowledge(outbox_keys(#KEYS - 7), ARGV[15], ARGV[17], ARGV[16])
"""

_SAVE_FIXED_ARGS = 14
"""The save script's arguments before the outbox rows (the acking save's: 3 more)."""


def save_script(
    ttl_ms: int, *, release: bool = False, ack: bool = False, recent: bool = False
) -> LuaScript:
    """The save script of a store whose finished threads expire after ``ttl_ms`` ms
    (0: never); with ``release``, a written save also releases its lease (a leased
    save only); with ``ack`` too, it also acknowledges an outbox message (``_SAVE_ACK``).
    The saves without ``ack`` run the same script as before ``ack`` existed. With
    ``recent`` (a standalone server), KEYS[10] is the namespace's recency index, which
    the save moves the thread in when its second differs from the head's before
    (``_SAVE_RECENT``); the outbox keys follow it."""
    if ack and not release:
        raise ValueError("an acking save is a releasing save: pass release=True with ack=True")
    fixed = _SAVE_FIXED_ARGS + (3 if ack else 0)
    body = _SAVE.replace("@TTL@", str(int(ttl_ms)))
    body = body.replace("@OLD@", ", 'updated_at'" if recent else "")
    body = body.replace("@RECENT@", _SAVE_RECENT if recent else "")
    body = body.replace("@FORGET@", "\n    redis.call('ZREM', KEYS[10], gone)" if recent else "")
    body = body.replace("@OUTBOX@", "10" if recent else "9")
    body = body.replace("@FIXED@", str(fixed)).replace("@ROW@", str(fixed + 1))
    tail = (_SAVE_RELEASE if release else "") + (_SAVE_ACK if ack else "")
    return LuaScript(body.replace("@RELEASE@", tail))


HISTORY = LuaScript("""
-- KEYS: head, hist.  ARGV: limit.  Returns {head revision, record, ...} newest first
-- (false for a missing entry), or {0} when the thread does not exist.
local h = redis.call('HMGET', KEYS[1], 'revision', 'oldest')
local rev = tonumber(h[1])
if not rev then return {0} end
local lo = math.max(tonumber(h[2]) or 1, rev - tonumber(ARGV[1]) + 1)
local out = fields('HMGET', KEYS[2], rev, lo, -1)
table.insert(out, 1, rev)
return out
""")

PRUNE = LuaScript("""
-- KEYS: head, hist.  ARGV: keep, batch.  Deletes up to `batch` of the oldest entries
-- beyond the newest `keep`; returns how many remain to delete.
local h = redis.call('HMGET', KEYS[1], 'revision', 'oldest')
local rev = tonumber(h[1])
if not rev then return 0 end
local oldest = tonumber(h[2]) or 1
local cutoff = rev - tonumber(ARGV[1]) + 1
if cutoff <= oldest then return 0 end
local stop = math.min(cutoff - 1, oldest + tonumber(ARGV[2]) - 1)
fields('HDEL', KEYS[2], oldest, stop, 1)
redis.call('HSET', KEYS[1], 'oldest', stop + 1)
return cutoff - 1 - stop
""")

DELETE = LuaScript("""
-- KEYS: head, hist, lease, threads, exp, timers, inbox, sigids, journal[, the recency
--       index of a standalone server].
-- ARGV: if_idle, thread id.
-- Returns {} once deleted, or {owner, token, exp} of the live lease that refused it.
local now = now_us()
local l, live = live_lease(KEYS[3], now)
if live and ARGV[1] == '1' then return {l[1], l[2], l[3]} end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[7], KEYS[8], KEYS[9])
forget(KEYS[4], KEYS[5], KEYS[6], ARGV[2])
if KEYS[10] then redis.call('ZREM', KEYS[10], ARGV[2]) end
-- A record is dropped only once the clock passed its token: the next is larger.
if not live and (tonumber(l[2]) or 0) < now then redis.call('DEL', KEYS[3]) end
return {}
""")

LIST = LuaScript("""
-- KEYS: (threads, exp, timers) of each shard.  ARGV: limit, after ('' for none), the
-- status digits listed, ascending.  Returns up to `limit` members (digit .. id) past
-- `after` of every shard and status, merged in id order and joined by NUL (no id has
-- one); '' for none.
-- Each (shard, status) range is read a few members at a time, as the merge (of the ranges
-- kept in order of their next member) needs them, so a page reads about `limit` members
-- however many threads the sets hold. A range's first read runs on to the end of the
-- last status listed: when its status ends there, the read shows which status has
-- members next, so the statuses without any cost no read. Ids are merged in byte order,
-- like ZRANGEBYLEX's (Lua's own string comparison follows the server's locale).
local limit, after = tonumber(ARGV[1]), ARGV[2]
local batch = math.ceil(limit / math.max(#KEYS / 3, 1)) + 2
local stop = '(' .. (tonumber(ARGV[#ARGV]) + 1)
-- The range's next member, and its id's first 12 bytes as two numbers of 6 bytes (0 past
-- its end, and no id has a NUL) for a quick comparison.
local function head(r)
  local m = r.buf[r.pos]
  local a, b, c, d, e, f = string.byte(m, 2, 7)
  r.hi = ((((a * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)) * 256 + (e or 0)) * 256
    + (f or 0)
  a, b, c, d, e, f = string.byte(m, 8, 13)
  r.lo = (((((a or 0) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)) * 256
    + (e or 0)) * 256 + (f or 0)
  r.m = m
end
local function earlier(x, y)
  if x.hi ~= y.hi then return x.hi < y.hi end
  if x.lo ~= y.lo then return x.lo < y.lo end
  local a, b = x.m, y.m
  for i = 14, math.min(#a, #b) do
    local p, q = string.byte(a, i), string.byte(b, i)
    if p ~= q then return p < q end
  end
  return #a < #b
end
-- The ranges with members left, ordered by their next member, the first last.
local ranges = {}
local function place(r)
  local lo, hi = 1, #ranges + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if earlier(ranges[mid], r) then hi = mid else lo = mid + 1 end
  end
  table.insert(ranges, lo, r)
end
-- Read up to r.n members of the range past r.last, until `to`; the next read takes twice
-- as many (a range read again is dense).
local function read(r, to)
  local from = (r.last == '' and '[' .. r.d) or '(' .. r.d .. r.last
  r.buf = redis.call('ZRANGEBYLEX', r.s.set, from, to, 'LIMIT', 0, r.n)
  r.pos, r.more, r.n = 1, #r.buf == r.n, math.min(2 * r.n, limit + 2)
end
local function advance(r)
  r.pos = r.pos + 1
  if r.pos > #r.buf then
    if not r.more then return false end
    read(r, '(' .. (tonumber(r.d) + 1))
    if #r.buf == 0 then return false end
  end
  head(r)
  return true
end
-- Open the range of status ARGV[j] of shard s; return the position in ARGV of the next
-- status of s that may have members past `after` (false: none).
local function open(s, j)
  local r = {s = s, d = ARGV[j], last = after, n = batch}
  read(r, stop)
  local buf, digit, next_j = r.buf, string.byte(r.d), false
  if #buf > 0 and string.byte(buf[#buf]) ~= digit then
    local lo, hi = 1, #buf  -- the first member of a later status
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if string.byte(buf[mid]) ~= digit then hi = mid else lo = mid + 1 end
    end
    local later = string.byte(buf[lo])
    for x = #buf, lo, -1 do buf[x] = nil end
    r.more = false
    for x = j + 1, #ARGV do
      if string.byte(ARGV[x]) >= later then
        next_j = x
        break
      end
    end
  elseif r.more and j < #ARGV then
    next_j = j + 1  -- nothing read of a later status: it may have members
  end
  if #buf > 0 then
    head(r)
    place(r)
  end
  return next_j
end
-- A thread expired under completed_ttl is skipped and forgotten (as the save script
-- forgets it) once its time in `exp` is a second past: its head's own expiry, set by the
-- save after it read the clock, is later by that save's run time. A member expired more
-- recently is listed, and HEADS finds its head gone.
local before, gone = false, {}
local function expired(s, id)
  if gone[id] then return true end
  if s.stale == nil then  -- once per shard: has any of its threads expired?
    before = before or now_ms() - 1000
    s.stale = #redis.call('ZRANGEBYSCORE', s.exp, '-inf', '(' .. before, 'LIMIT', 0, 1) > 0
  end
  if not s.stale then return false end
  local at = redis.call('ZSCORE', s.exp, id)
  if not at or tonumber(at) >= before then return false end
  forget(s.set, s.exp, s.timers, id)
  gone[id] = true
  return true
end
for i = 1, #KEYS, 3 do
  local s, j = {set = KEYS[i], exp = KEYS[i + 1], timers = KEYS[i + 2]}, 3
  while j do j = open(s, j) end
end
local out = {}
while #out < limit and #ranges > 0 do
  local r = ranges[#ranges]
  ranges[#ranges] = nil
  r.last = string.sub(r.m, 2)
  if not expired(r.s, r.last) then out[#out + 1] = r.m end
  if advance(r) then place(r) end
end
return table.concat(out, '\\0')
""")

HEADS = LuaScript(
    """
-- KEYS: of each shard listed, its threads set, then the heads read.  ARGV: the status
-- digits listed (one string), then for each shard its index members of those heads,
-- joined by NUL.  Returns a JSON array with, per head, its revision and HEAD_COLUMNS
-- ('' for a column the head was saved without), or false when the head is gone or its
-- status is not listed. A member whose digit is not the head's status is stale (the
-- thread expired or was deleted, or a save moved it since): it is removed.
local listed, out, k = ARGV[1], {}, 1
for a = 2, #ARGV do
  local set = KEYS[k]
  for member in string.gmatch(ARGV[a], '[^%z]+') do
    k = k + 1
    local h = redis.call('HMGET', KEYS[k], 'revision', @COLUMNS@)
    local d = h[1] and DIGIT[h[5]]
    if d ~= string.sub(member, 1, 1) then redis.call('ZREM', set, member) end
    if d and string.find(listed, d, 1, true) then
      for c = 2, #h do h[c] = h[c] or '' end
      out[#out + 1] = h
    else
      out[#out + 1] = false
    end
  end
  k = k + 1
end
return cjson.encode(out)
""".replace("@COLUMNS@", ", ".join(f"'{c}'" for c in HEAD_COLUMNS))
)

RECENT = LuaScript("""
-- KEYS: the recency index.  ARGV: limit, the cursor's second ('' for none) and thread id.
-- Returns {id, second, ...}: up to `limit` members below the cursor, newest second first,
-- then ids in descending byte order (the set's own order for equal scores).
local z, limit = KEYS[1], tonumber(ARGV[1])
local start = 0
if ARGV[2] ~= '' then
  local s, id = ARGV[2], ARGV[3]
  -- Ids in byte order (Lua's own string comparison follows the server's locale).
  local function below(a, b)
    for i = 1, math.min(#a, #b) do
      local p, q = string.byte(a, i), string.byte(b, i)
      if p ~= q then return p < q end
    end
    return #a < #b
  end
  -- The members of the cursor's second are ranks lo .. hi - 1 (the newer ones come
  -- first); the first of them below the cursor's id is found by bisection.
  local lo = redis.call('ZCOUNT', z, '(' .. s, '+inf')
  local hi = lo + redis.call('ZCOUNT', z, s, s)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if below(redis.call('ZREVRANGE', z, mid, mid)[1], id) then hi = mid else lo = mid + 1 end
  end
  start = lo
end
return redis.call('ZREVRANGE', z, start, start + limit - 1, 'WITHSCORES')
""")

RECENT_HEADS = LuaScript(
    """
-- KEYS: the recency index, then the heads read.  ARGV: their thread ids.  Returns a JSON
-- array with, per head, its revision and HEAD_COLUMNS ('' for a column the head was
-- saved without), or false when the head is gone (deleted, or expired under
-- completed_ttl): its member is removed.
local out = {}
for i = 2, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'revision', @COLUMNS@)
  if h[1] then
    for c = 2, #h do h[c] = h[c] or '' end
    out[#out + 1] = h
  else
    redis.call('ZREM', KEYS[1], ARGV[i - 1])
    out[#out + 1] = false
  end
end
return cjson.encode(out)
""".replace("@COLUMNS@", ", ".join(f"'{c}'" for c in HEAD_COLUMNS))
)

RECENT_FILL = LuaScript("""
-- KEYS: the recency index, then heads.  ARGV: their thread ids.  Adds each head that
-- exists and has no member yet (a save's member is never older), scored by its save
-- second: the one-time fill of an index that threads saved before it lack.
for i = 2, #KEYS do
  local at = redis.call('HGET', KEYS[i], 'updated_at')
  if at then redis.call('ZADD', KEYS[1], 'NX', math.floor(tonumber(at)), ARGV[i - 1]) end
end
return #KEYS - 1
""")

LAYOUT = LuaScript("""
-- KEYS: meta.  ARGV: shards, layout version.  Records the layout once; returns it.
redis.call('HSETNX', KEYS[1], 'shards', ARGV[1])
redis.call('HSETNX', KEYS[1], 'layout', ARGV[2])
return redis.call('HMGET', KEYS[1], 'shards', 'layout')
""")

TIMERS = LuaScript("""
-- KEYS: (timers, exp) of each shard.  ARGV: before (a score), limit.
-- Returns {id, wake_at, ...}: up to `limit` per shard due at or before `before`, in
-- (wake_at, id) order. A member whose thread expired under completed_ttl (its expiry in
-- `exp` is past) is removed, not listed.
local now = now_ms()
local limit = tonumber(ARGV[2])
local out = {}
for base = 1, #KEYS, 2 do
  local found
  repeat
    local stale = false
    found = {}
    local got = redis.call('ZRANGEBYSCORE', KEYS[base], '-inf', ARGV[1], 'WITHSCORES',
      'LIMIT', 0, limit)
    for i = 1, #got, 2 do
      local exp = redis.call('ZSCORE', KEYS[base + 1], got[i])
      if exp and tonumber(exp) <= now then
        redis.call('ZREM', KEYS[base], got[i])
        stale = true
      else
        found[#found + 1] = got[i]
        found[#found + 1] = got[i + 1]
      end
    end
  until not stale
  for i = 1, #found do out[#out + 1] = found[i] end
end
return out
""")

SIGNAL = LuaScript("""
-- KEYS: inbox, sigids, head.  ARGV: signal id, data, max seq.
-- Returns {seq, 1} once stored as the next signal, {seq, 0} of the signal stored
-- before under this id, or {last seq, -1} when the next would pass max seq (the
-- inbox is full); the last two write nothing.
local seq = redis.call('HGET', KEYS[2], ARGV[1])
if seq then return {tonumber(seq), 0} end
seq = redis.call('HLEN', KEYS[1]) + 1
if seq > tonumber(ARGV[3]) then return {seq - 1, -1} end
redis.call('HSET', KEYS[1], seq, ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], seq)
align(KEYS[3], KEYS[1], KEYS[2])
return {seq, 1}
""")

SIGNALS = LuaScript("""
-- KEYS: inbox.  ARGV: after, limit.  Returns the data of signals after+1, after+2, …
-- (up to `limit`; false for a missing one).
local after = tonumber(ARGV[1])
local last = math.min(redis.call('HLEN', KEYS[1]), after + tonumber(ARGV[2]))
return fields('HMGET', KEYS[1], after + 1, last, 1)
""")

ACTIVITY = LuaScript("""
-- KEYS: journal, head.  ARGV: key, data.  Stores (replaces) the journal entry.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
align(KEYS[2], KEYS[1])
return 1
""")

ACQUIRE = LuaScript("""
-- KEYS: lease.  ARGV: owner, ttl_us, nonce.  Returns {1, token, exp} or, when a live
-- lease holds the thread, {0, owner, token, exp}.
local now = now_us()
local l, live = live_lease(KEYS[1], now)
if live then
  if l[4] == ARGV[3] then return {1, l[2], l[3]} end
  return {0, l[1], l[2], l[3]}
end
local token = math.max((tonumber(l[2]) or 0) + 1, now)
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', fmt(token), 'exp', fmt(exp),
  'anonce', ARGV[3])
expire_after(KEYS[1], exp, token)
return {1, fmt(token), fmt(exp)}
""")

ACQUIRE_HEAD = LuaScript("""
-- KEYS: lease, head, hist.  ARGV: owner, ttl_us, nonce.  ACQUIRE, then the head read
-- in the same script: {1, token, exp, head revision (0: none), record} or, when a live
-- lease holds the thread, {0, owner, token, exp}.
local now = now_us()
local l, live = live_lease(KEYS[1], now)
local token, exp
if live then
  if l[4] ~= ARGV[3] then return {0, l[1], l[2], l[3]} end
  token, exp = l[2], l[3]
else
  local t = math.max((tonumber(l[2]) or 0) + 1, now)
  local e = now + tonumber(ARGV[2])
  token, exp = fmt(t), fmt(e)
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token, 'exp', exp, 'anonce', ARGV[3])
  expire_after(KEYS[1], e, t)
end
local rev = tonumber(redis.call('HGET', KEYS[2], 'revision'))
if not rev then return {1, token, exp, 0} end
return {1, token, exp, rev, redis.call('HGET', KEYS[3], rev)}
""")

RENEW = LuaScript("""
-- KEYS: lease.  ARGV: owner, token, ttl_us.  Returns the new expiry, or false.
local now = now_us()
local l, live = live_lease(KEYS[1], now)
if not fenced(l, live, ARGV[1], ARGV[2]) then return false end
local exp = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'exp', fmt(exp))
expire_after(KEYS[1], exp, l[2])
return fmt(exp)
""")

RELEASE = LuaScript(
    """
-- KEYS: lease.  ARGV: owner, token, nonce.  Returns 1 once released, else 0.  The
-- record becomes a tombstone (token and nonce) that expires soon.
local now = now_us()
local l, live = live_lease(KEYS[1], now)
if l[5] == ARGV[3] and l[2] == ARGV[2] then return 1 end
if not fenced(l, live, ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'exp', '0', 'rnonce', ARGV[3])
expire_after(KEYS[1], now + @RELEASED@ * 1000, l[2])
return 1
""".replace("@RELEASED@", str(RELEASED_TTL_MS))
)

HOLDER = LuaScript("""
-- KEYS: lease.  Returns {owner, token, exp} of the live lease, or {}.
local l, live = live_lease(KEYS[1], now_us())
if live then return {l[1], l[2], l[3]} end
return {}
""")

APPEND = LuaScript("""
-- KEYS: 7 outbox keys of one shard.  ARGV: key, payload, queue, priority, partition.
append(outbox_keys(0), ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return 1
""")

CLAIM = LuaScript("""
-- KEYS: 7 per shard.  ARGV: group, consumer, limit, visibility_ms, queue, held, the
-- prefix of the queues' keys ('' to keep no limits or counts: a cluster's claim).
-- Returns {{shard position, message id, payload, attempts, error}...}, and when nothing
-- was claimed the last entry id of each shard (where a blocking wait starts).
--
-- With a prefix, the queue's limits (a JSON object in the `limits` hash), its messages
-- in flight (`fly:<queue>`, and `pfly:<queue>\\0<partition>` per partition: sorted sets
-- of message -> in flight until, ms) and its starts (`starts:<queue>`, `pstarts:...`:
-- start ms, while a rate limit is set) are read and written in this same script.
local group, consumer, queue, gp = ARGV[1], ARGV[2], ARGV[5], ARGV[7]
local now = now_ms()
local n, deadline = tonumber(ARGV[3]), now + tonumber(ARGV[4])
local L, rated, since = {}, false, 0
local fly = gp .. 'fly:' .. queue
local function live(key, floor)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', floor)
  return redis.call('ZCARD', key)
end
if gp ~= '' then
  local raw = redis.call('HGET', gp .. 'limits', queue)
  if raw then
    for name, value in pairs(cjson.decode(raw)) do
      if value ~= cjson.null then L[name] = value end
    end
  end
  if L.worker_concurrency then n = math.min(n, L.worker_concurrency - tonumber(ARGV[6])) end
  if L.global_concurrency then n = math.min(n, L.global_concurrency - live(fly, now)) end
  rated = L.rate_limit ~= nil or L.partition_rate_limit ~= nil
  if rated then
    since = now - math.floor(L.rate_period * 1000)
    local started = live(gp .. 'starts:' .. queue, since)
    if L.rate_limit then n = math.min(n, L.rate_limit - started) end
  end
end
local out, lasts, shards = {}, {}, {}
for base = 0, #KEYS - 1, 7 do
  local k = outbox_keys(base)
  index_old(k)
  -- Hidden entries whose time is up (timed out, or released and their delay over)
  -- become visible in their queues again.
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k.vis, '-inf', now)) do
    local e = redis.call('XRANGE', k.stream, id, id)
    if #e == 0 then
      redis.pcall('XACK', k.stream, group, id)
      redis.call('ZREM', k.vis, id)
    else
      make_ready(k, id, e[1][2])
    end
  end
  shards[#shards + 1] = {k = k, pos = base / 7 + 1, ready = shard_key(k, 'ready:' .. queue),
    tag = string.match(k.stream, '{.-}'), skipped = 0, buf = {}, at = 1, more = true}
end
-- Take the ready entries in (priority, order) across the shards, skipping those of
-- full partitions; each shard's set is read a batch at a time as the merge needs it.
local batch = math.max(n, 0) + 8
local function head(s)
  if s.at > #s.buf then
    if not s.more then return nil end
    s.buf = redis.call('ZRANGE', s.ready, s.skipped, s.skipped + batch - 1, 'WITHSCORES')
    s.at, s.more = 1, #s.buf == 2 * batch
    if #s.buf == 0 then return nil end
  end
  return s.buf[s.at], tonumber(s.buf[s.at + 1])
end
local pfly, pstarted = {}, {}
local function full(part)
  if part == '' or gp == '' then return false end
  if L.partition_concurrency then
    if not pfly[part] then pfly[part] = live(gp .. 'pfly:' .. queue .. '\\0' .. part, now) end
    if pfly[part] >= L.partition_concurrency then return true end
  end
  if L.partition_rate_limit then
    if not pstarted[part] then
      pstarted[part] = live(gp .. 'pstarts:' .. queue .. '\\0' .. part, since)
    end
    if pstarted[part] >= L.partition_rate_limit then return true end
  end
  return false
end
local stamp = 0
while #out < n do
  local best, bm, bp
  for _, s in ipairs(shards) do
    local m, p = head(s)
    if m and (not best or p < bp or (p == bp and string.sub(m, 1, 26) < string.sub(bm, 1, 26)))
    then
      best, bm, bp = s, m, p
    end
  end
  if not best then break end
  best.at = best.at + 2
  local id, part = string.match(bm, '^%d+|([^|]+)|(.*)$')
  if full(part) then
    best.skipped = best.skipped + 1
  else
    local k = best.k
    redis.call('ZREM', best.ready, bm)
    local p = redis.pcall('XPENDING', k.stream, group, id, id, 1)
    if type(p) == 'table' and p.err then
      if string.sub(p.err, 1, 7) ~= 'NOGROUP' then return redis.error_reply(p.err) end
      redis.call('XGROUP', 'CREATE', k.stream, group, '0', 'MKSTREAM')
      p = {}
    end
    local attempts = ((p[1] and tonumber(p[1][4])) or 0) + 1
    local e = redis.call('XCLAIM', k.stream, group, consumer, 0, id, 'RETRYCOUNT', attempts,
      'FORCE')
    if #e > 0 and e[1] then
      redis.call('ZADD', k.vis, deadline, id)
      local mid = field(e[1][2], 'mid') or id
      out[#out + 1] = {best.pos, mid, field(e[1][2], 'intent') or '', attempts,
        redis.call('HGET', k.errs, mid) or ''}
      if gp ~= '' then
        local member = best.tag .. mid
        redis.call('ZADD', fly, deadline, member)
        if part ~= '' then
          redis.call('ZADD', gp .. 'pfly:' .. queue .. '\\0' .. part, deadline, member)
          if pfly[part] then pfly[part] = pfly[part] + 1 end
        end
        if rated then
          stamp = stamp + 1
          local start = fmt(now_us()) .. ':' .. stamp
          redis.call('ZADD', gp .. 'starts:' .. queue, now, start)
          if stamp == 1 then redis.call('SADD', gp .. 'started', queue) end
          if part ~= '' then
            redis.call('ZADD', gp .. 'pstarts:' .. queue .. '\\0' .. part, now, start)
            if pstarted[part] then pstarted[part] = pstarted[part] + 1 end
          end
        end
      end
    else
      redis.pcall('XACK', k.stream, group, id)  -- a member whose entry is gone
    end
  end
end
if #out == 0 then
  for _, s in ipairs(shards) do
    local last = redis.call('XREVRANGE', s.k.stream, '+', '-', 'COUNT', 1)
    lasts[s.pos] = (last[1] and last[1][1]) or '0-0'
  end
end
return {out, lasts}
""")

ACK = LuaScript("""
-- KEYS: 7 of one shard.  ARGV: group, message id, the prefix of the queues' keys.
acknowledge(outbox_keys(0), ARGV[1], ARGV[3], ARGV[2])
return 1
""")

RELEASE_MESSAGE = LuaScript("""
-- KEYS: 7 of one shard.  ARGV: group, message id, error, delay_ms, dead ('1'/'0'), the
-- prefix of the queues' keys.  Returns 0 when the message is not pending (acked or
-- unknown): nothing to do.  A released message is hidden until its delay is over, and
-- no longer in flight.
local k = outbox_keys(0)
local group, mid, err = ARGV[1], ARGV[2], ARGV[3]
local id = entry_of(k, mid)
local p = redis.pcall('XPENDING', k.stream, group, id, id, 1)
if type(p) ~= 'table' or p.err or #p == 0 then return 0 end
if ARGV[5] == '1' then
  bury(k, group, ARGV[6], id, mid, err)
  return 1
end
if err == '' then
  redis.call('HDEL', k.errs, mid)
else
  redis.call('HSET', k.errs, mid, err)
end
local f = unqueue(k, ARGV[6], id, mid)
if f then redis.call('ZADD', k.vis, now_ms() + tonumber(ARGV[4]), id) end
return 1
""")

DEAD_LIST = LuaScript("""
-- KEYS: 7 per shard.  ARGV: limit.  Returns {{shard position, dead entry id, message
-- id, payload, attempts, error}...}, oldest first within each shard.
local out = {}
for base = 0, #KEYS - 1, 7 do
  local k = outbox_keys(base)
  for _, e in ipairs(redis.call('XRANGE', k.dead, '-', '+', 'COUNT', tonumber(ARGV[1]))) do
    local f = e[2]
    out[#out + 1] = {base / 7 + 1, e[1], field(f, 'mid') or e[1], field(f, 'intent') or '',
      field(f, 'attempts') or '0', field(f, 'error') or ''}
  end
end
return out
""")

STATS = LuaScript("""
-- KEYS: 7 per shard (stream, vis, dead, ...).  Returns {live entries, the first live
-- entry id ('' when none), dead letters} per shard.  Acks and burials delete their
-- entries, so every entry of a stream is a live message, and its id (milliseconds of
-- the server's clock) says when it was added.
local out = {}
for base = 0, #KEYS - 1, 7 do
  local first = redis.call('XRANGE', KEYS[base + 1], '-', '+', 'COUNT', 1)
  out[#out + 1] = {redis.call('XLEN', KEYS[base + 1]), (first[1] and first[1][1]) or '',
    redis.call('XLEN', KEYS[base + 3])}
end
return out
""")

RETRY_DEAD = LuaScript("""
-- KEYS: 7 of one shard.  ARGV: message id.  Returns 0 when it is not a dead letter.
local k = outbox_keys(0)
local did = redis.call('HGET', k.deadix, ARGV[1])
if not did then return 0 end
return revive(k, ARGV[1], did, false)
""")

QUEUE_COUNTS = LuaScript("""
-- KEYS: 7 per shard.  ARGV: the prefix of the queues' keys.  Returns {queue, in flight,
-- pending, order of the oldest pending ('' when none), starts in the rate window}
-- for each queue with live messages or starts: the ready sets and the hidden entries of
-- every shard are read (the cost grows with the backlog).
local gp = ARGV[1]
local now = now_ms()
local seen, names = {}, {}
local function name(q)
  if not seen[q] then
    seen[q] = {live = 0, oldest = false}
    names[#names + 1] = q
  end
  return seen[q]
end
local function older(c, o)
  if not c.oldest or o < c.oldest then c.oldest = o end
end
for _, q in ipairs(redis.call('SMEMBERS', gp .. 'started')) do name(q) end
for base = 0, #KEYS - 1, 7 do
  local k = outbox_keys(base)
  index_old(k)
  local tag = string.match(k.stream, '{.-}')
  for _, q in ipairs(redis.call('SMEMBERS', shard_key(k, 'queues'))) do
    local c = name(q)
    for _, m in ipairs(redis.call('ZRANGE', shard_key(k, 'ready:' .. q), 0, -1)) do
      c.live = c.live + 1
      older(c, string.sub(m, 1, 26))
    end
  end
  for _, id in ipairs(redis.call('ZRANGE', k.vis, 0, -1)) do
    local e = redis.call('XRANGE', k.stream, id, id)
    if #e > 0 then
      local q, _, o = route_of(e[1][2], id)
      local c = name(q)
      c.live = c.live + 1
      local until_ = redis.call('ZSCORE', gp .. 'fly:' .. q, tag .. (field(e[1][2], 'mid') or id))
      if not until_ or tonumber(until_) <= now then older(c, o) end
    end
  end
end
local out = {}
for _, q in ipairs(names) do
  local c = seen[q]
  local flying = redis.call('ZCOUNT', gp .. 'fly:' .. q, '(' .. now, '+inf')
  local started = 0
  local raw = redis.call('HGET', gp .. 'limits', q)
  if raw then
    local L = cjson.decode(raw)
    if L.rate_limit ~= cjson.null or L.partition_rate_limit ~= cjson.null then
      local since = now - math.floor(L.rate_period * 1000)
      started = redis.call('ZCOUNT', gp .. 'starts:' .. q, '(' .. since, '+inf')
    end
  end
  if c.live > 0 or started > 0 then
    out[#out + 1] = {q, flying, math.max(c.live - flying, 0), c.oldest or '', started}
  end
end
return out
""")

QUEUE_MESSAGES = LuaScript("""
-- KEYS: 7 per shard.  ARGV: queue, limit, group.  Returns {shard position, priority,
-- order, message id, payload, attempts, error} of the first `limit` ready entries and
-- every hidden entry of the queue, per shard (the caller merges them in claim order).
local q, limit, group = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out = {}
for base = 0, #KEYS - 1, 7 do
  local k = outbox_keys(base)
  index_old(k)
  local ids = {}
  for _, m in ipairs(redis.call('ZRANGE', shard_key(k, 'ready:' .. q), 0, limit - 1)) do
    ids[#ids + 1] = string.match(m, '^%d+|([^|]+)|')
  end
  for _, id in ipairs(redis.call('ZRANGE', k.vis, 0, -1)) do ids[#ids + 1] = id end
  for _, id in ipairs(ids) do
    local e = redis.call('XRANGE', k.stream, id, id)
    if #e > 0 then
      local f = e[1][2]
      local eq, p, o = route_of(f, id)
      if eq == q then
        local pend = redis.pcall('XPENDING', k.stream, group, id, id, 1)
        local attempts = 0
        if type(pend) == 'table' and not pend.err and pend[1] then attempts = pend[1][4] end
        local mid = field(f, 'mid') or id
        out[#out + 1] = {base / 7 + 1, p, o, mid, field(f, 'intent') or '', attempts,
          redis.call('HGET', k.errs, mid) or ''}
      end
    end
  end
end
return out
""")

READS = frozenset(
    {HISTORY, LIST, HEADS, TIMERS, SIGNALS, HOLDER, DEAD_LIST, STATS, RECENT, RECENT_HEADS}
)
"""The scripts that only read (the clean-up of stale index entries some do is
idempotent): when one fails, nothing is in doubt, and its error says so."""
