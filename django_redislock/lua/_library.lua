-- _library.lua: functions shared by every script below (prepended to each; not a script itself).
-- Error messages and line numbers of a failing script are reported relative to the script's own
-- file (scripts.py maps them back), so this library's length does not shift them.
--
-- A lock's value is one JSON object, always written by record() so its layout is fixed:
--   {"o": owner, "n": hold count, "t": fencing token, "at": acquired-at (server epoch ms),
--    ["w": waiter id of a hand-off not yet claimed,] "m": {metadata}}
-- "m" comes last and is kept as the raw JSON the client sent, so rewriting the hold count never
-- re-encodes (and never loses precision in) the metadata. Field values are JSON-encoded, so the
-- quoted markers searched for below can only occur as structure, never inside a string.

local function record(owner, count, token, at, waiter, meta)
  local w = ''
  if waiter then w = ',"w":' .. cjson.encode(waiter) end
  return string.format('{"o":%s,"n":%d,"t":%d,"at":%d%s,"m":%s}', cjson.encode(owner), count,
    token, at, w, meta)
end

-- Position just after the owner field when the value belongs to `owner`, else nil (a prefix
-- compare: no JSON decoding on the hot path).
local function owner_end(raw, owner)
  if not raw then return nil end
  local prefix = '{"o":' .. cjson.encode(owner) .. ','
  if string.sub(raw, 1, #prefix) == prefix then return #prefix + 1 end
  return nil
end

-- Hold count, token and acquired-at of one of our records, read from just after its owner.
local function fields_at(raw, pos)
  local n, t, at = string.match(raw, '^"n":(%d+),"t":(%d+),"at":(%d+)', pos)
  return tonumber(n), tonumber(t), tonumber(at)
end

local function meta_of(raw)
  local i = string.find(raw, ',"m":', 1, true)
  return string.sub(raw, i + 5, -2)
end

-- True when the value is a hand-off reserved for `waiter` and not yet claimed.
local function reserved_for(raw, waiter)
  local marker = ',"w":' .. cjson.encode(waiter) .. ','
  local i = string.find(raw, marker, 1, true)
  return i ~= nil and i < string.find(raw, ',"m":', 1, true)
end

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The next fencing token of a lock. The counter expires one day after it was seeded (INCR keeps
-- the TTL), so names no longer used cost no memory. A missing counter is seeded from the server
-- clock in microseconds: the previous seed is at least a day (86.4e9 us) older, and no lock is
-- acquired 86.4e9 times in a day, so the new seed exceeds every token issued before it.
local FENCE_TTL_MS = 86400000
local function next_token(fence_key)
  local token = redis.call('INCR', fence_key)
  if token == 1 then
    local t = redis.call('TIME')
    token = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', fence_key, string.format('%d', token), 'PX', FENCE_TTL_MS)
  end
  return token
end

-- Take a free lock for `owner` (hold count 1, a new token); returns acquire.lua's reply for it,
-- the bare token (an integer costs Redis less to build and send than a table).
local function take(lock_key, fence_key, owner, lease_ms, meta)
  local token = next_token(fence_key)
  redis.call('SET', lock_key, record(owner, 1, token, server_ms(), nil, meta), 'PX', lease_ms)
  return token
end

-- A waiter entry in the queue list: "expiry_ms\nwaiter_id\nowner\nlease_ms\nmeta_json". The
-- waiter id is "<process token>.<sequence>"; its process listens on <prefix><process token>.
local function parse_entry(entry)
  return string.match(entry, '^(%d+)\n([^\n]*)\n([^\n]*)\n(%d+)\n(.*)$')
end

local function channel_of(prefix, waiter)
  return prefix .. string.match(waiter, '^([^.]*)')
end

-- Queue a waiter (or refresh its entry in place, keeping its position). The list lives as long
-- as its longest-lived entry. Returns the entry.
local function enqueue(queue_key, entry_ms, waiter, owner, lease_ms, meta, prev, now)
  local entry = string.format('%d\n%s\n%s\n%d\n%s', now + entry_ms, waiter, owner, lease_ms, meta)
  local at = false
  if prev ~= '' then at = redis.call('LPOS', queue_key, prev) end
  if at then
    redis.call('LSET', queue_key, at, entry)
  else
    redis.call('RPUSH', queue_key, entry)
  end
  if redis.call('PTTL', queue_key) < entry_ms then redis.call('PEXPIRE', queue_key, entry_ms) end
  return entry
end

-- A waiter re-checks on its own no later than its entry's expiry minus this margin (the client
-- sets entries to expire ENTRY_MARGIN = 2 s after its planned re-check: engine.ENTRY_MARGIN).
local ENTRY_MARGIN_MS = 2000

-- Tell the next waiter in line to re-check when the new holder's lease (or claim window) ends,
-- if it would otherwise re-check later than that (a new holder that dies or freezes then costs
-- at most its own lease). Usually its own timer is earlier already, and nothing is sent.
local function tell_next(queue_key, prefix, lease_ms, now)
  local nxt = redis.call('LINDEX', queue_key, 0)
  if nxt then
    local x2, w2 = parse_entry(nxt)
    if w2 and now + lease_ms < tonumber(x2) - ENTRY_MARGIN_MS then
      redis.call('PUBLISH', channel_of(prefix, w2), string.format('r %s %d', w2, lease_ms))
    end
  end
end

-- Pop queue entries until one belongs to a live waiter and give it the next fencing token:
-- returns its waiter, owner, lease, metadata and token, or nil when nobody live waits. A waiter
-- of the process running this script (`here`, its process token; nil: none) is not published
-- to: that process is alive, and wakes its waiter itself (6th value true). Any other waiter's
-- process is told on its channel: "h <waiter> <token>" when `trust` is "1" (a single Redis, where PUBLISH
-- counts every subscriber: the waiter holds the lock from now on, with its full lease, and a
-- waiter whose process no longer listens is skipped), "h <waiter>" otherwise (the waiter must
-- claim the reservation; see hand_off).
local function next_waiter(queue_key, fence_key, prefix, trust, now, here)
  local entry = redis.call('LPOP', queue_key)
  while entry do
    local x, w, o, l, m = parse_entry(entry)
    if x and tonumber(x) > now then
      local token = next_token(fence_key)
      if here and string.match(w, '^([^.]*)') == here then return w, o, tonumber(l), m, token, true end
      local message = 'h ' .. w
      if trust == '1' then message = message .. string.format(' %d', token) end
      local heard = redis.call('PUBLISH', channel_of(prefix, w), message)
      if heard > 0 or trust ~= '1' then return w, o, tonumber(l), m, token end
    end
    entry = redis.call('LPOP', queue_key)
  end
  return nil
end

-- Give the lock to the oldest live waiter, or delete it when nobody waits.
--
-- On a single Redis (`trust` "1") the waiter is handed the lock outright: full lease, and its
-- token in the wake-up message, so it returns holding the lock without another round trip. A
-- waiter whose process died is skipped at once (PUBLISH reached nobody).
--
-- Where PUBLISH cannot tell (a Cluster counts one node's subscribers), the lock is only reserved
-- for the waiter for a short claim window (claim_ms) and the woken waiter confirms with
-- acquire.lua, which sets the full lease: a waiter that died costs one claim window. The next
-- waiter in line is told when the window ends ("r <waiter> <ms>"), so it re-checks then.
-- Either way the record names the waiter ("w"), so a waiter that missed its message finds the
-- lock reserved for it when it re-checks. Entries whose expiry passed are dropped. An empty
-- queue is handled like a queue of dead entries (the lock is deleted); callers on a hot path
-- check LLEN first, which is one command instead of TIME and LPOP.
-- Returns the new holder's token, or false when the lock was deleted; and, when the new holder is
-- a waiter of the calling process (`here`, see next_waiter), its id: the caller must wake it.
-- With claim_ms "0" (independent masters, Redlock) nothing is reserved: a lock held on a
-- majority cannot be handed over by one master, so every live waiter is told to try again now.
local function wake_all(queue_key, prefix, now)
  local entries = redis.call('LRANGE', queue_key, 0, -1)
  redis.call('DEL', queue_key)
  for _, entry in ipairs(entries) do
    local x, w = parse_entry(entry)
    if x and tonumber(x) > now then
      redis.call('PUBLISH', channel_of(prefix, w), 'r ' .. w .. ' 0')
    end
  end
end

local function hand_off(lock_key, fence_key, queue_key, prefix, trust, claim_ms, here)
  local now = server_ms()
  if tonumber(claim_ms) == 0 then
    wake_all(queue_key, prefix, now)
    redis.call('DEL', lock_key)
    return false
  end
  local w, o, l, m, token, mine = next_waiter(queue_key, fence_key, prefix, trust, now, here)
  if not w then
    redis.call('DEL', lock_key)
    return false
  end
  -- The next waiter learns when the new holder's lease (or claim window) ends: it re-checks
  -- then, should the new holder die or freeze without releasing.
  local lease = trust == '1' and l or tonumber(claim_ms)
  redis.call('SET', lock_key, record(o, 1, token, now, w, m), 'PX', lease)
  tell_next(queue_key, prefix, lease, now)
  if mine then return token, w end
  return token
end

-- Semaphores: <ns>:sem:{name} is a sorted set of fencing tokens scored by their expiry (server
-- ms): a lease per permit, so a crashed holder frees its permit when its lease ends.
-- <ns>:semrec:{name} is a hash: token -> the permit's record (as for locks), "permits" -> the
-- limit last used, "w:<waiter>" -> the token reserved for a woken waiter until it claims it.

-- Drop permits whose lease ended.
local function sem_purge(sem_key, rec_key, now)
  local dead = redis.call('ZRANGEBYSCORE', sem_key, '-inf', now)
  for _, token in ipairs(dead) do
    local rec = redis.call('HGET', rec_key, token)
    if rec then
      local w = string.match(rec, ',"w":"([^"]*)",')
      if w then redis.call('HDEL', rec_key, 'w:' .. w) end
      redis.call('HDEL', rec_key, token)
    end
  end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', sem_key, '-inf', now) end
end

-- Both keys live exactly as long as their longest permit.
local function sem_touch(sem_key, rec_key)
  local last = redis.call('ZRANGE', sem_key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', sem_key, last[2])
    redis.call('PEXPIREAT', rec_key, last[2])
  else
    redis.call('DEL', sem_key, rec_key)
  end
end

-- Take a permit for `owner` (for `waiter`, with `token`, when a hand-off gives it).
local function sem_take(sem_key, rec_key, fence_key, owner, lease_ms, meta, waiter, now, token)
  token = token or next_token(fence_key)
  redis.call('ZADD', sem_key, now + lease_ms, token)
  redis.call('HSET', rec_key, token, record(owner, 1, token, now, waiter, meta))
  if waiter then redis.call('HSET', rec_key, 'w:' .. waiter, token) end
  return token
end

-- A woken waiter confirms the permit reserved for it: the full lease starts now.
local function sem_claim(sem_key, rec_key, waiter, owner, lease_ms, meta, now)
  local token = redis.call('HGET', rec_key, 'w:' .. waiter)
  if not token then return nil end
  redis.call('HDEL', rec_key, 'w:' .. waiter)
  local rec = redis.call('HGET', rec_key, token)
  local pos = rec and owner_end(rec, owner)
  if not pos or not redis.call('ZSCORE', sem_key, token) then return nil end
  local _, t, at = fields_at(rec, pos)
  redis.call('ZADD', sem_key, now + lease_ms, token)
  redis.call('HSET', rec_key, token, record(owner, 1, t, at, nil, meta))
  return t
end

-- Reserve free permits for the oldest live waiters (the semaphore's hand_off).
local function sem_hand_off(sem_key, rec_key, fence_key, queue_key, prefix, trust, claim_ms, now)
  local permits = tonumber(redis.call('HGET', rec_key, 'permits')) or 1
  local handed = 0
  while redis.call('ZCARD', sem_key) < permits and redis.call('LLEN', queue_key) > 0 do
    local w, o, l, m, token = next_waiter(queue_key, fence_key, prefix, trust, now)
    if not w then break end
    -- Single Redis: the waiter holds the permit now (full lease); else reserved until claimed.
    local lease = trust == '1' and l or tonumber(claim_ms)
    sem_take(sem_key, rec_key, fence_key, o, lease, m, w, now, token)
    handed = handed + 1
  end
  if handed > 0 then
    local first = redis.call('ZRANGE', sem_key, 0, 0, 'WITHSCORES')
    tell_next(queue_key, prefix, math.max(1, tonumber(first[2]) - now), now)
  end
  sem_touch(sem_key, rec_key)
  return handed
end
