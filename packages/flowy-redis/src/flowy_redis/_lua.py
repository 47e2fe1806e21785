"""The Lua library the scripts share, and how a script is composed with it.

The functions scripts share are written once, in ``LIBRARY``; a :class:`LuaScript` is a
script's body preceded by the functions of the library it calls (and those they call), so
each script sent to Redis carries only what it uses.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from ._keys import STATUS_DIGITS

__all__ = ["LIBRARY", "LuaScript"]


_DIGITS = ", ".join(
    f"{status.value} = '{digit.decode()}'" for status, digit in STATUS_DIGITS.items()
)


def _library(text: str) -> dict[str, str]:
    """The functions of ``text`` (separated by blank lines) by name."""
    functions: dict[str, str] = {}
    for function in text.strip().split("\n\n"):
        name = re.search(r"^local (?:function )?(\w+)", function, re.MULTILINE)
        assert name is not None, function
        functions[name.group(1)] = function + "\n"
    return functions


# The shared functions; each calls only those before it (Lua's locals need that).
LIBRARY = _library(
    """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function now_ms()
  return math.floor(now_us() / 1000)
end

local function fmt(n)
  return string.format('%.0f', n)
end

-- The lease record's fields (owner, token, exp, anonce, rnonce), and whether it is live
-- at `now` (µs of the server's clock).
local function live_lease(key, now)
  local l = redis.call('HMGET', key, 'owner', 'token', 'exp', 'anonce', 'rnonce')
  return l, l[3] ~= false and tonumber(l[3]) > now
end

-- The fencing check: with a lease (owner, token) it is the live lease; without one
-- (token ''), no live lease holds the thread.
local function fenced(l, live, owner, token)
  if token == '' then return not live end
  return live and l[1] == owner and l[2] == token
end

-- The lease record lives until the server's clock has passed both `us` and its token,
-- so the next token (max(token + 1, now)) is larger.
local function expire_after(key, us, token)
  redis.call('PEXPIREAT', key, math.floor(math.max(us, tonumber(token)) / 1000) + 1)
end

local DIGIT = {@DIGITS@}

-- Remove thread `id` from its shard's indexes: threads (every status), exp and timers.
local function forget(threads, exp, timers, id)
  redis.call('ZREM', threads, '0' .. id, '1' .. id, '2' .. id, '3' .. id)
  redis.call('ZREM', exp, id)
  redis.call('ZREM', timers, id)
end

-- Under completed_ttl a finished thread's keys expire with its head: a key written
-- while the head is expiring expires with it.
local function align(head, ...)
  local ttl = redis.call('PTTL', head)
  if ttl > 0 then
    for _, key in ipairs({...}) do redis.call('PEXPIRE', key, ttl) end
  end
end

-- HMGET or HDEL of fields from, from + step, …, to of hash `key`, 500 a call; returns
-- the values read, in that order (false for a missing field).
local function fields(cmd, key, from, to, step)
  local out = {}
  for s = from, to, 500 * step do
    local e = s + 499 * step
    if (e - to) * step > 0 then e = to end
    local names = {}
    for x = s, e, step do names[#names + 1] = x end
    local got = redis.call(cmd, key, unpack(names))
    if cmd == 'HMGET' then
      for i = 1, #got do out[#out + 1] = got[i] end
    end
  end
  return out
end

local function field(f, name)
  for i = 1, #f, 2 do
    if f[i] == name then return f[i + 1] end
  end
  return false
end

-- The keys of a shard's outbox start at KEYS[base + 1].
local function outbox_keys(base)
  return {stream = KEYS[base + 1], vis = KEYS[base + 2], dead = KEYS[base + 3],
    deadix = KEYS[base + 4], errs = KEYS[base + 5], alias = KEYS[base + 6],
    ids = KEYS[base + 7]}
end

local function entry_of(k, mid)
  return redis.call('HGET', k.alias, mid) or mid
end

-- The shard's key of `kind` (its outbox keys share the prefix `<ns>:{<ns>:<i>}:`).
local function shard_key(k, kind)
  return string.sub(k.stream, 1, -7) .. kind
end

-- The route of an entry with fields `f`: queue, priority, order, partition key. An
-- entry written before queues is of the default queue, priority 0, in entry id order.
local function route_of(f, id)
  local o = field(f, 'o')
  if not o then
    local ms, seq = string.match(id, '(%d+)-(%d+)')
    o = string.format('%016.0f%010.0f', tonumber(ms) * 1000, tonumber(seq))
  end
  return field(f, 'q') or 'default', tonumber(field(f, 'p') or '0'), o, field(f, 'k') or ''
end

-- Entry `id` (fields `f`) becomes visible: a member of its queue's ready set, ordered
-- by priority (the score), then order; the member also names the entry and partition.
local function make_ready(k, id, f)
  local q, p, o, part = route_of(f, id)
  redis.call('ZADD', shard_key(k, 'ready:' .. q), p, o .. '|' .. id .. '|' .. part)
  redis.call('ZREM', k.vis, id)
end

-- Once per shard: index the entries written before queues (idempotent).
local function index_old(k)
  local flag = shard_key(k, 'queued')
  if redis.call('EXISTS', flag) == 1 then return end
  local after = '-'
  while true do
    local es = redis.call('XRANGE', k.stream, after, '+', 'COUNT', 500)
    for _, e in ipairs(es) do
      if not redis.call('ZSCORE', k.vis, e[1]) then make_ready(k, e[1], e[2]) end
      redis.call('SADD', shard_key(k, 'queues'), field(e[2], 'q') or 'default')
    end
    if #es < 500 then break end
    after = '(' .. es[#es][1]
  end
  redis.call('SET', flag, '1')
end

-- Add an entry for message `mid` (a new message when false) on route (q, p, part).
local function add(k, payload, key, mid, q, p, part)
  local n = redis.call('INCR', shard_key(k, 'seq'))
  local o = string.format('%016.0f%010.0f', now_us(), n % 10000000000)
  local f = {'intent', payload, 'key', key, 'q', q, 'p', p, 'k', part, 'o', o}
  if mid then
    f[#f + 1] = 'mid'
    f[#f + 1] = mid
  end
  local id = redis.call('XADD', k.stream, '*', unpack(f))
  redis.call('ZADD', shard_key(k, 'ready:' .. q), p, o .. '|' .. id .. '|' .. part)
  redis.call('SADD', shard_key(k, 'queues'), q)
  return id
end

-- Bring dead letter `mid` back as a new entry keeping its id and route; attempts and
-- error reset.
local function revive(k, mid, did, payload)
  local e = redis.call('XRANGE', k.dead, did, did)
  redis.call('HDEL', k.deadix, mid)
  if #e == 0 then return 0 end
  local f = e[1][2]
  local id = add(k, payload or field(f, 'intent'), field(f, 'key') or '', mid,
    field(f, 'q') or 'default', field(f, 'p') or '0', field(f, 'k') or '')
  redis.call('HSET', k.alias, mid, id)
  redis.call('XDEL', k.dead, did)
  return 1
end

-- Add a message on route (q, p, part) unless one for `key` (revision:thread) lives;
-- revive a dead one.
local function append(k, key, payload, q, p, part)
  local mid = redis.call('HGET', k.ids, key)
  if mid then
    local did = redis.call('HGET', k.deadix, mid)
    if did and revive(k, mid, did, payload) == 1 then return end
    local id = entry_of(k, mid)
    if #redis.call('XRANGE', k.stream, id, id) > 0 then return end
  end
  local id = add(k, payload, key, false, q, p, part)
  redis.call('HSET', k.ids, key, id)
end

-- Message `mid` of queue `q` (partition `part`) is no longer in flight; `gp` is the
-- prefix of the queues' keys ('' when the store keeps no queue counts).
local function land(k, gp, q, part, mid)
  if gp == '' then return end
  local member = string.match(k.stream, '{.-}') .. mid
  redis.call('ZREM', gp .. 'fly:' .. q, member)
  if part ~= '' then redis.call('ZREM', gp .. 'pfly:' .. q .. '\\0' .. part, member) end
end

-- Entry `id` (message `mid`) leaves its queue's ready set and the in-flight counts;
-- returns its fields (false when there is no such entry).
local function unqueue(k, gp, id, mid)
  local e = redis.call('XRANGE', k.stream, id, id)
  if #e == 0 then return false end
  local q, _, o, part = route_of(e[1][2], id)
  redis.call('ZREM', shard_key(k, 'ready:' .. q), o .. '|' .. id .. '|' .. part)
  land(k, gp, q, part, mid)
  return e[1][2]
end

-- Remove entry `id` (message `mid`) from the live messages for good.
local function drop(k, group, gp, id, mid)
  unqueue(k, gp, id, mid)
  redis.pcall('XACK', k.stream, group, id)
  redis.call('XDEL', k.stream, id)
  redis.call('ZREM', k.vis, id)
  redis.call('HDEL', k.errs, mid)
  redis.call('HDEL', k.alias, mid)
end

-- Move entry `id` (message `mid`) to the dead letters, with its route.
local function bury(k, group, gp, id, mid, err)
  local e = redis.call('XRANGE', k.stream, id, id)
  if #e > 0 then
    local p = redis.call('XPENDING', k.stream, group, id, id, 1)
    local f = e[1][2]
    local q, prio, _, part = route_of(f, id)
    local did = redis.call('XADD', k.dead, '*', 'mid', mid, 'intent', field(f, 'intent') or '',
      'key', field(f, 'key') or '', 'attempts', (p[1] and p[1][4]) or 0, 'error', err,
      'q', q, 'p', prio, 'k', part)
    redis.call('HSET', k.deadix, mid, did)
  end
  drop(k, group, gp, id, mid)
end

-- Acknowledge message `mid`: its key (revision:thread) no longer names it, and it leaves
-- the live messages for good. A message already gone changes nothing.
local function acknowledge(k, group, gp, mid)
  local id = entry_of(k, mid)
  local e = redis.call('XRANGE', k.stream, id, id)
  if #e > 0 then
    local key = field(e[1][2], 'key')
    if key and redis.call('HGET', k.ids, key) == mid then redis.call('HDEL', k.ids, key) end
  end
  drop(k, group, gp, id, mid)
end
""".replace("@DIGITS@", _DIGITS)
)


@dataclass(frozen=True)
class LuaScript:
    """A script's body composed with the shared functions it calls, and its SHA-1 (the
    EVALSHA handle)."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        text, needed = self.source, set[str]()
        for name, function in reversed(LIBRARY.items()):  # a function calls earlier ones only
            if re.search(rf"\b{name}\b", text):
                needed.add(name)
                text += function
        source = "".join(f for name, f in LIBRARY.items() if name in needed) + self.source
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "sha", hashlib.sha1(source.encode("utf-8")).hexdigest())
