"""The Lua scripts: every multi-key change of the backend is one script, run with EVALSHA.

Each script reads the clock with ``redis.call('TIME')`` (the server's clock, never the
client's), declares every key it touches in ``KEYS`` (all of one hash slot), and answers
with a status code first. Saves and lease changes are idempotent under a resend of the
same call (a driver that retries after a timeout): a save whose exact record is already
the head at the new revision answers "ok", and lease calls carry a nonce.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "ACK",
    "ACQUIRE",
    "CLAIM",
    "DEAD_LIST",
    "DELETE",
    "HEADS",
    "HISTORY",
    "HOLDER",
    "LAYOUT",
    "LIST_MEMBERS",
    "LOAD",
    "OK",
    "PRUNE",
    "RELEASE",
    "RELEASE_MESSAGE",
    "RENEW",
    "RETRY_DEAD",
    "SAVE",
    "STATUS_CONFLICT",
    "STATUS_LEASE_BUSY",
    "STATUS_LEASE_LOST",
    "LuaScript",
    "save_script",
]

OK = 0
"""Status code: the operation was applied."""
STATUS_CONFLICT = 1
"""Status code: the stored revision is not the expected one (the actual one follows)."""
STATUS_LEASE_LOST = 2
"""Status code: the given lease is not the thread's live lease (owner, token, exp follow)."""
STATUS_LEASE_BUSY = 3
"""Status code: a live lease holds the thread (owner, token, exp, now follow)."""


@dataclass(frozen=True)
class LuaScript:
    """A script's source and its SHA-1 (the EVALSHA handle)."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode("utf-8")).hexdigest())


_PRELUDE = """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(n)
  return string.format('%.0f', n)
end
"""

_SAVE_SOURCE = (
    _PRELUDE
    + """
-- KEYS: head, hist, lease, index [, outbox]
-- ARGV: expected, record, pointer, status, reason, handoff_status, handoff_pending_at,
--       updated_at, flags ('1' to treat an identical record at the head as this very
--       save, else '0'; then '' or '<token>:<owner>' of the lease), intent...
-- Returns the new revision (a number) when saved, else {status code, details...}.
local TTL = @TTL@
local IX = {none = 0, pending = 1, enqueued = 2, orphaned = 3}
local expected = tonumber(ARGV[1])
local h = redis.call('HMGET', KEYS[1], 'revision', 'handoff_status', 'status')
local cur = tonumber(h[1]) or 0
if cur == expected + 1 and string.byte(ARGV[9]) == 49
    and redis.call('HGET', KEYS[2], cur) == ARGV[2] then
  return cur
end
local lease = string.sub(ARGV[9], 2)
local now = 0
local l = redis.call('HMGET', KEYS[3], 'owner', 'token', 'exp')
local live = false
if l[3] then
  now = now_us()
  live = tonumber(l[3]) > now
end
if lease ~= '' then
  if not live or (l[2] .. ':' .. l[1]) ~= lease then
    if now == 0 then now = now_us() end
    return {2, l[1] or '', l[2] or '0', l[3] or '0', fmt(now)}
  end
elseif live then
  return {3, l[1], l[2], l[3], fmt(now)}
end
if cur ~= expected then
  return {1, cur}
end
local rev = cur + 1
local terminal = TTL > 0 and (ARGV[4] == 'completed' or ARGV[4] == 'failed')
local was_terminal = h[3] == 'completed' or h[3] == 'failed'
if cur == 0 then
  redis.call('HSET', KEYS[1], 'revision', rev, 'pointer', ARGV[3], 'status', ARGV[4],
    'reason', ARGV[5], 'handoff_status', ARGV[6], 'handoff_pending_at', ARGV[7],
    'updated_at', ARGV[8], 'oldest', rev)
else
  redis.call('HSET', KEYS[1], 'revision', rev, 'pointer', ARGV[3], 'status', ARGV[4],
    'reason', ARGV[5], 'handoff_status', ARGV[6], 'handoff_pending_at', ARGV[7],
    'updated_at', ARGV[8])
end
redis.call('HSET', KEYS[2], rev, ARGV[2])
if terminal then
  redis.call('PEXPIRE', KEYS[1], TTL)
  redis.call('PEXPIRE', KEYS[2], TTL)
elseif was_terminal then
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
end
if cur == 0 or h[2] ~= ARGV[6] or terminal or was_terminal then
  -- The index member is the encoded id: the head key's last ':'-separated part.
  local member = string.match(KEYS[1], '[^:]*$')
  local base = IX[ARGV[6]] * 281474976710656
  if terminal then
    if now == 0 then now = now_us() end
    local now_ms = math.floor(now / 1000)
    redis.call('ZADD', KEYS[4], fmt(base + now_ms + TTL), member)
    redis.call('ZREMRANGEBYSCORE', KEYS[4], fmt(base), '(' .. fmt(base + now_ms))
  else
    redis.call('ZADD', KEYS[4], fmt(base + 281474976710655), member)
  end
end
for i = 10, #ARGV do
  redis.call('XADD', KEYS[5], '*', 'intent', ARGV[i])
end
return rev
"""
)


def save_script(ttl_ms: int) -> LuaScript:
    """The save script of a checkpointer whose completed threads expire after
    ``ttl_ms`` ms (0: never)."""
    return LuaScript("save", _SAVE_SOURCE.replace("@TTL@", str(int(ttl_ms))))


SAVE = save_script(0)
"""The save script of a checkpointer without ``completed_ttl``."""


LOAD = LuaScript(
    "load",
    """
-- KEYS: head, hist.  Returns {revision, pointer, record} of the head, or {} if none.
local h = redis.call('HMGET', KEYS[1], 'revision', 'pointer')
if not h[1] then
  return {}
end
return {h[1], h[2], redis.call('HGET', KEYS[2], h[1])}
""",
)

HISTORY = LuaScript(
    "history",
    """
-- KEYS: head, hist.  ARGV: limit.  Returns {head revision, record, record, ...} newest
-- first (false for a missing entry), or {0} when the thread does not exist.
local h = redis.call('HMGET', KEYS[1], 'revision', 'oldest')
local rev = tonumber(h[1])
if not rev then
  return {0}
end
local lo = math.max(tonumber(h[2]) or 1, rev - tonumber(ARGV[1]) + 1)
local out = {rev}
local r = rev
while r >= lo do
  local stop = math.max(lo, r - 499)
  local fields = {}
  for x = r, stop, -1 do fields[#fields + 1] = x end
  local got = redis.call('HMGET', KEYS[2], unpack(fields))
  for i = 1, #got do out[#out + 1] = got[i] end
  r = stop - 1
end
return out
""",
)

PRUNE = LuaScript(
    "prune",
    """
-- KEYS: head, hist.  ARGV: retain, batch.  Deletes up to `batch` of the oldest entries
-- beyond the newest `retain` (at least 1); returns how many remain to delete.
local h = redis.call('HMGET', KEYS[1], 'revision', 'oldest')
local rev = tonumber(h[1])
if not rev then
  return 0
end
local keep = math.max(tonumber(ARGV[1]), 1)
local oldest = tonumber(h[2]) or 1
local cutoff = rev - keep + 1
if cutoff <= oldest then
  return 0
end
local stop = math.min(cutoff - 1, oldest + tonumber(ARGV[2]) - 1)
local fields = {}
for x = oldest, stop do
  fields[#fields + 1] = x
  if #fields == 500 then
    redis.call('HDEL', KEYS[2], unpack(fields))
    fields = {}
  end
end
if #fields > 0 then
  redis.call('HDEL', KEYS[2], unpack(fields))
end
redis.call('HSET', KEYS[1], 'oldest', stop + 1)
return cutoff - 1 - stop
""",
)

DELETE = LuaScript(
    "delete",
    _PRELUDE
    + """
-- KEYS: head, hist, lease, index.  ARGV: only_if_idle.  The lease key (its token
-- counter) is kept.
if ARGV[1] == '1' then
  local now = now_us()
  local l = redis.call('HMGET', KEYS[3], 'owner', 'token', 'exp')
  if l[3] and tonumber(l[3]) > now then
    return {3, l[1], l[2], l[3], fmt(now)}
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[4], string.match(KEYS[1], '[^:]*$'))
return {0}
""",
)

LIST_MEMBERS = LuaScript(
    "list_members",
    """
-- KEYS: index sorted sets (one per shard).  ARGV: limit, status position...
-- Returns the members of the wanted statuses whose expiry is not past.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  for j = 2, #ARGV do
    if #out >= limit then return out end
    local base = tonumber(ARGV[j]) * 281474976710656
    local got = redis.call('ZRANGEBYSCORE', KEYS[i], string.format('%.0f', base + now_ms),
      string.format('%.0f', base + 281474976710655), 'LIMIT', 0, limit - #out)
    for k = 1, #got do out[#out + 1] = got[k] end
  end
end
return out
""",
)

HEADS = LuaScript(
    "heads",
    """
-- KEYS: head hashes.  Returns the listing columns of each, 7 per key (false if gone).
local out = {}
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'revision', 'pointer', 'status', 'reason',
    'handoff_status', 'handoff_pending_at', 'updated_at')
  for j = 1, 7 do out[#out + 1] = h[j] end
end
return out
""",
)

LAYOUT = LuaScript(
    "layout",
    """
-- KEYS: meta.  ARGV: shards, layout version.  Records the layout once; returns it.
redis.call('HSETNX', KEYS[1], 'shards', ARGV[1])
redis.call('HSETNX', KEYS[1], 'layout', ARGV[2])
return redis.call('HMGET', KEYS[1], 'shards', 'layout')
""",
)

ACQUIRE = LuaScript(
    "acquire",
    _PRELUDE
    + """
-- KEYS: lease.  ARGV: owner, ttl_us, nonce.
local now = now_us()
local l = redis.call('HMGET', KEYS[1], 'owner', 'token', 'exp', 'anonce')
if l[3] and tonumber(l[3]) > now then
  if l[4] == ARGV[3] then
    return {0, l[2], l[3]}
  end
  return {3, l[1], l[2], l[3], fmt(now)}
end
local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
local exp = fmt(now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'exp', exp, 'anonce', ARGV[3])
return {0, fmt(token), exp}
""",
)

RENEW = LuaScript(
    "renew",
    _PRELUDE
    + """
-- KEYS: lease.  ARGV: owner, token, ttl_us.
local now = now_us()
local l = redis.call('HMGET', KEYS[1], 'owner', 'token', 'exp')
if not (l[3] and tonumber(l[3]) > now) or l[1] ~= ARGV[1] or l[2] ~= ARGV[2] then
  return {2, l[1] or '', l[2] or '0', l[3] or '0', fmt(now)}
end
local exp = fmt(now + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'exp', exp)
return {0, exp}
""",
)

RELEASE = LuaScript(
    "release",
    _PRELUDE
    + """
-- KEYS: lease.  ARGV: owner, token, nonce.  The token counter stays.
local now = now_us()
local l = redis.call('HMGET', KEYS[1], 'owner', 'token', 'exp', 'rnonce')
if l[4] == ARGV[3] and l[1] == ARGV[1] and l[2] == ARGV[2] then
  return {0}
end
if not (l[3] and tonumber(l[3]) > now) or l[1] ~= ARGV[1] or l[2] ~= ARGV[2] then
  return {2, l[1] or '', l[2] or '0', l[3] or '0', fmt(now)}
end
redis.call('HSET', KEYS[1], 'exp', '0', 'rnonce', ARGV[3])
return {0}
""",
)

HOLDER = LuaScript(
    "holder",
    _PRELUDE
    + """
-- KEYS: lease.  Returns {1, owner, token, exp} for a live lease, else {0}.
local now = now_us()
local l = redis.call('HMGET', KEYS[1], 'owner', 'token', 'exp')
if l[3] and tonumber(l[3]) > now then
  return {1, l[1], l[2], l[3]}
end
return {0}
""",
)

_CONSUMER_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return false
end
-- Move entry `id` (message `mid`) of `stream` to the dead letters.
local function bury(k, group, id, mid, payload, attempts, err, now)
  if err == '' then
    err = redis.call('HGET', k.errs, mid) or
      'the visibility timeout ran out on the last allowed delivery'
  end
  local did = redis.call('XADD', k.dead, '*', 'mid', mid, 'intent', payload or '',
    'attempts', attempts, 'error', err, 'at', now)
  redis.call('HSET', k.deadix, mid, did)
  redis.call('XACK', k.stream, group, id)
  redis.call('XDEL', k.stream, id)
  redis.call('ZREM', k.vis, id)
  redis.call('HDEL', k.errs, mid)
  redis.call('HDEL', k.alias, mid)
end
local function shard_keys(base)
  return {stream = KEYS[base + 1], vis = KEYS[base + 2], dead = KEYS[base + 3],
    deadix = KEYS[base + 4], errs = KEYS[base + 5], alias = KEYS[base + 6]}
end
"""

CLAIM = LuaScript(
    "claim",
    _CONSUMER_PRELUDE
    + """
-- KEYS: 6 per shard (stream, vis, dead, deadix, errs, alias).
-- ARGV: group, consumer, limit, visibility_ms, max_attempts.
-- Returns {{shard position, message id, payload, attempts}...}, {last entry id per shard}.
local group, consumer = ARGV[1], ARGV[2]
local limit, vis_ms, max_attempts = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local deadline = now + vis_ms
local out, lasts = {}, {}
for base = 0, #KEYS - 1, 6 do
  local k = shard_keys(base)
  local pos = base / 6 + 1
  if #out < limit then
    -- Deliveries whose visibility ran out (released ones are due at 0).
    local due = redis.call('ZRANGEBYSCORE', k.vis, '-inf', now, 'LIMIT', 0, limit - #out)
    for _, id in ipairs(due) do
      local p = redis.call('XPENDING', k.stream, group, id, id, 1)
      if #p == 0 then
        redis.call('ZREM', k.vis, id)
      else
        local dc = tonumber(p[1][4])
        if dc >= max_attempts then
          local e = redis.call('XRANGE', k.stream, id, id)
          if #e == 0 then
            redis.call('XACK', k.stream, group, id)
            redis.call('ZREM', k.vis, id)
          else
            local mid = field(e[1][2], 'mid') or id
            bury(k, group, id, mid, field(e[1][2], 'intent'), dc, '', now)
          end
        else
          local e = redis.call('XCLAIM', k.stream, group, consumer, 0, id)
          if #e == 0 or not e[1] then
            redis.call('XACK', k.stream, group, id)
            redis.call('ZREM', k.vis, id)
          else
            redis.call('ZADD', k.vis, deadline, id)
            out[#out + 1] = {pos, field(e[1][2], 'mid') or id, field(e[1][2], 'intent'), dc + 1}
          end
        end
      end
    end
  end
  if #out < limit then
    -- Entries never delivered.
    local r = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', limit - #out,
      'STREAMS', k.stream, '>')
    if type(r) == 'table' and r.err then
      if string.sub(r.err, 1, 7) ~= 'NOGROUP' then
        return redis.error_reply(r.err)
      end
      redis.call('XGROUP', 'CREATE', k.stream, group, '0', 'MKSTREAM')
      r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', limit - #out,
        'STREAMS', k.stream, '>')
    end
    if r then
      for _, e in ipairs(r[1][2]) do
        redis.call('ZADD', k.vis, deadline, e[1])
        out[#out + 1] = {pos, field(e[2], 'mid') or e[1], field(e[2], 'intent'), 1}
      end
    end
  end
  local last = redis.call('XREVRANGE', k.stream, '+', '-', 'COUNT', 1)
  lasts[pos] = (last[1] and last[1][1]) or '0-0'
end
return {out, lasts}
""",
)

ACK = LuaScript(
    "ack",
    _CONSUMER_PRELUDE
    + """
-- KEYS: 6 of one shard.  ARGV: group, message id.
local k = shard_keys(0)
local mid = ARGV[2]
local id = redis.call('HGET', k.alias, mid) or mid
redis.pcall('XACK', k.stream, ARGV[1], id)
redis.call('XDEL', k.stream, id)
redis.call('ZREM', k.vis, id)
redis.call('HDEL', k.errs, mid)
redis.call('HDEL', k.alias, mid)
return 1
""",
)

RELEASE_MESSAGE = LuaScript(
    "release_message",
    _CONSUMER_PRELUDE
    + """
-- KEYS: 6 of one shard.  ARGV: group, message id, error, max_attempts.
-- Returns 0 (not pending: nothing to do), 1 (claimable again now) or 2 (dead-lettered).
local k = shard_keys(0)
local group, mid, err = ARGV[1], ARGV[2], ARGV[3]
local id = redis.call('HGET', k.alias, mid) or mid
local p = redis.pcall('XPENDING', k.stream, group, id, id, 1)
if type(p) ~= 'table' or p.err or #p == 0 then
  return 0
end
local dc = tonumber(p[1][4])
if dc >= tonumber(ARGV[4]) then
  local e = redis.call('XRANGE', k.stream, id, id)
  if #e == 0 then
    redis.call('XACK', k.stream, group, id)
    redis.call('ZREM', k.vis, id)
    return 0
  end
  bury(k, group, id, mid, field(e[1][2], 'intent'), dc, err, now_ms())
  return 2
end
if err ~= '' then
  redis.call('HSET', k.errs, mid, err)
end
redis.call('ZADD', k.vis, 0, id)
return 1
""",
)

DEAD_LIST = LuaScript(
    "dead_list",
    _CONSUMER_PRELUDE
    + """
-- KEYS: 6 per shard.  ARGV: limit.  Returns {{shard position, dead entry id, message id,
-- payload, attempts, error}...}, oldest first within each shard.
local limit = tonumber(ARGV[1])
local out = {}
for base = 0, #KEYS - 1, 6 do
  local k = shard_keys(base)
  local got = redis.call('XRANGE', k.dead, '-', '+', 'COUNT', limit)
  for _, e in ipairs(got) do
    out[#out + 1] = {base / 6 + 1, e[1], field(e[2], 'mid'), field(e[2], 'intent'),
      field(e[2], 'attempts'), field(e[2], 'error')}
  end
end
return out
""",
)

RETRY_DEAD = LuaScript(
    "retry_dead",
    _CONSUMER_PRELUDE
    + """
-- KEYS: 6 of one shard.  ARGV: message id.  Puts a dead letter back in the outbox as a
-- new entry that keeps its message id; returns 0 when there is no such dead letter.
local k = shard_keys(0)
local mid = ARGV[1]
local did = redis.call('HGET', k.deadix, mid)
if not did then
  return 0
end
redis.call('HDEL', k.deadix, mid)
local e = redis.call('XRANGE', k.dead, did, did)
if #e == 0 then
  return 0
end
local id = redis.call('XADD', k.stream, '*', 'intent', field(e[1][2], 'intent'), 'mid', mid)
redis.call('HSET', k.alias, mid, id)
redis.call('XDEL', k.dead, did)
return 1
""",
)
