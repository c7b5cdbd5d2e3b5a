-- debounce_postpone.lua: the run of a burst is due but must wait (its key runs, a limit is
-- reached, or its publish failed): move its due time in the index, so the rescue does not
-- publish it again meanwhile, or drop the burst.
--
-- KEYS[1] <ns>:debounce:{task}:<lock key>
-- KEYS[2] <ns>:debounce-due:{task}
-- ARGV[1] the burst's flight id
-- ARGV[2] ms from now the run will be delivered again
-- ARGV[3] ms an unclaimed record outlives that time
-- ARGV[4] the lock key (the index member)
-- ARGV[5] "move"; "drop": delete the burst if this id's publish was its only one (its message
--         could not be sent), else leave it to the rescue; "cancel": delete it (revoked)
--
-- Returns 1 when the burst was moved or deleted, 0 when no burst of this id is pending (or a
-- drop found later publishes).

local now = server_ms()
local rec = redis.call('HMGET', KEYS[1], 'id', 'n')
if rec[1] ~= ARGV[1] then return 0 end
if ARGV[5] ~= 'move' then
  if ARGV[5] == 'drop' and tonumber(rec[2]) ~= 1 then return 0 end
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[4])
  return 1
end
local due = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], due, ARGV[4])
local keep = tonumber(ARGV[2]) + tonumber(ARGV[3])
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
return 1
