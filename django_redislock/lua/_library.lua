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
  return '{"o":' .. cjson.encode(owner) .. ',"n":' .. string.format('%d', count)
    .. ',"t":' .. string.format('%d', token) .. ',"at":' .. string.format('%d', at)
    .. w .. ',"m":' .. meta .. '}'
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

-- A waiter entry in the queue list: "expiry_ms\nwaiter_id\nowner\nmeta_json". The waiter id is
-- "<process token>.<sequence>"; its process listens on the channel <prefix><process token>.
local function parse_entry(entry)
  return string.match(entry, '^(%d+)\n([^\n]*)\n([^\n]*)\n(.*)$')
end

local function channel_of(prefix, waiter)
  return prefix .. string.match(waiter, '^([^.]*)')
end

-- Give the lock to the oldest live waiter, or delete it when nobody waits.
--
-- The lock is written for the waiter with a short claim window (claim_ms) and the waiter's
-- process is told on its channel ("h <waiter>"); the woken waiter confirms with acquire.lua,
-- which sets the full lease. A waiter whose process no longer listens (PUBLISH reaches nobody:
-- it died, or its listener is reconnecting and will make it re-check) is skipped at once when
-- `trust` is "1" (a single Redis, where PUBLISH counts every subscriber); otherwise a waiter that
-- never claims costs one claim window. The next waiter in line is told when the window ends
-- ("r <waiter> <ms>"), so it re-checks then instead of at the end of the previous holder's lease.
-- Entries whose expiry passed belong to waiters that gave up or died and are dropped.
-- Returns the new holder's token, or false when the lock was deleted.
local function hand_off(lock_key, fence_key, queue_key, prefix, trust, claim_ms)
  local entry = redis.call('LPOP', queue_key)
  if not entry then
    redis.call('DEL', lock_key)
    return false
  end
  local now = server_ms()
  while entry do
    local x, w, o, m = parse_entry(entry)
    if x and tonumber(x) > now then
      local heard = redis.call('PUBLISH', channel_of(prefix, w), 'h ' .. w)
      if heard > 0 or trust ~= '1' then
        local token = next_token(fence_key)
        redis.call('SET', lock_key, record(o, 1, token, now, w, m), 'PX', claim_ms)
        local nxt = redis.call('LINDEX', queue_key, 0)
        if nxt then
          local _, w2 = parse_entry(nxt)
          if w2 then
            redis.call('PUBLISH', channel_of(prefix, w2), 'r ' .. w2 .. ' ' .. claim_ms)
          end
        end
        return token
      end
    end
    entry = redis.call('LPOP', queue_key)
  end
  redis.call('DEL', lock_key)
  return false
end
