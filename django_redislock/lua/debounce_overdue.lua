-- debounce_overdue.lua: the bursts of a task whose run was due a while ago and has not been
-- claimed (its message was lost with a worker): candidates for debounce_rescue.lua.
--
-- KEYS[1] <ns>:debounce-due:{task}
-- ARGV[1] grace, ms: a run counts as overdue once it was due longer ago than this
-- ARGV[2] at most this many
--
-- Returns the lock keys (read-only).

local now = server_ms()
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0,
  tonumber(ARGV[2]))
