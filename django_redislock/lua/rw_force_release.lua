-- rw_force_release.lua: an operator frees one holder of a read-write lock (the writer or a
-- reader, by its fencing token) or every holder; the waiters that may go now re-check.
--
-- KEYS[1..6] as rw_acquire.lua: writer, readers, readers' records, fence, queue, waiters
-- ARGV[1] the holder's fencing token, "" for every holder; ARGV[2] wake channel prefix
-- ARGV[3] "1": SPUBLISH on the shard channel, "0": PUBLISH
--
-- Returns {n, side_1, record_1, ..., side_n, record_n}: the holders released ("w" or "r").

local now = server_ms()
rw_purge(KEYS, now)
local out = {0}
local function released(side, raw)
  out[1] = out[1] + 1
  out[#out + 1] = side
  out[#out + 1] = raw
end
local wraw = redis.call('GET', KEYS[1])
if wraw and (ARGV[1] == '' or string.match(wraw, '"t":(%d+)') == ARGV[1]) then
  redis.call('DEL', KEYS[1])
  released('w', wraw)
end
for _, owner in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local raw = redis.call('HGET', KEYS[3], owner)
  if raw and (ARGV[1] == '' or string.match(raw, '"t":(%d+)') == ARGV[1]) then
    redis.call('HDEL', KEYS[3], owner)
    redis.call('ZREM', KEYS[2], owner)
    released('r', raw)
  end
end
if out[1] > 0 then
  rw_touch(KEYS)
  rw_wake(KEYS, wake_to(ARGV[2], ARGV[3]), now)
end
return out
