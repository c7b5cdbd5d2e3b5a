-- debounce_rescue.lua: take the right to publish an overdue burst's run again (one rescuer per
-- grace period, however many workers look).
--
-- KEYS[1] <ns>:debounce:{task}:<lock key>
-- KEYS[2] <ns>:debounce-due:{task}
-- ARGV[1] grace, ms (as debounce_overdue.lua)
-- ARGV[2] the lock key (the index member)
--
-- Returns {flight id, arguments, route} when this caller publishes it, {} when it is not
-- overdue any more (claimed, postponed, taken by another rescuer) or its record expired (the
-- index entry is then removed).

local now = server_ms()
local due = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not due or tonumber(due) > now - tonumber(ARGV[1]) then return {} end
local rec = redis.call('HMGET', KEYS[1], 'id', 'args', 'route')
if not rec[1] then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return {}
end
redis.call('ZADD', KEYS[2], now, ARGV[2])
return {rec[1], rec[2], rec[3] or '{}'}
