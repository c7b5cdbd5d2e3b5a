-- _record.lua: helpers prepended to every script below (not a script of its own).
--
-- A lock's value is one JSON object, always written by these helpers so its layout is fixed:
--   {"o": owner, "n": hold count, "t": fencing token, "at": acquired-at (epoch ms), "m": {metadata}}
-- "m" comes last and is kept as the raw JSON the client sent, so rewriting the hold count never
-- re-encodes (and never loses precision in) the metadata.

local function record(owner, count, token, at, meta)
  return '{"o":' .. cjson.encode(owner) .. ',"n":' .. string.format('%d', count)
    .. ',"t":' .. string.format('%d', token) .. ',"at":' .. string.format('%d', at)
    .. ',"m":' .. meta .. '}'
end

-- True when the stored value belongs to `owner` (prefix compare: no JSON decoding needed).
local function owned_by(raw, owner)
  if not raw then return false end
  local prefix = '{"o":' .. cjson.encode(owner) .. ','
  return string.sub(raw, 1, #prefix) == prefix
end

local function meta_of(raw)
  local i = string.find(raw, ',"m":', 1, true)
  return string.sub(raw, i + 5, -2)
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

-- Give the lock to the oldest live waiter, or delete it when nobody waits.
-- A waiter entry is "expiry_ms \n lease_ms \n waiter_id \n owner \n meta_json"; entries whose
-- expiry passed belong to waiters that gave up or died and are dropped.
-- Returns the new holder's fencing token, or false when the lock was deleted.
local function hand_off(lock_key, fence_key, queue_key, wake_prefix)
  local now = nil
  while true do
    local entry = redis.call('LPOP', queue_key)
    if not entry then break end
    now = now or server_ms()
    local x, l, w, o, m = string.match(entry, '^(%d+)\n(%d+)\n([^\n]*)\n([^\n]*)\n(.*)$')
    if x and tonumber(x) > now then
      local token = next_token(fence_key)
      redis.call('SET', lock_key, record(o, 1, token, now, m), 'PX', l)
      local wake = wake_prefix .. w
      redis.call('RPUSH', wake, token)
      redis.call('PEXPIRE', wake, l)
      return token
    end
  end
  redis.call('DEL', lock_key)
  return false
end
