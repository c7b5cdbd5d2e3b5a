-- debounce_gather.lua: one publish of a debounced task (lock_mode="debounce") joins the burst of
-- its key, or starts one.
--
-- KEYS[1] <ns>:debounce:{task}:<lock key>  (HASH: id, first, last, n, args, route)
-- KEYS[2] <ns>:debounce-due:{task}          (ZSET: lock key -> when its run is due, epoch ms)
-- ARGV[1] flight id for a new burst (unique per publish call)
-- ARGV[2] the call's arguments (JSON text, stored as given)
-- ARGV[3] quiet period, ms
-- ARGV[4] longest wait after the first publish of a burst, ms (0: none)
-- ARGV[5] ms an unclaimed record outlives its due time (then it expires)
-- ARGV[6] the lock key (the index member)
-- ARGV[7] where the burst's messages go (JSON text, kept from the first publish)
--
-- Returns {flight id of the burst, 1 if ARGV[1] is that id (this publish started it) else 0,
-- ms until the run is due}. Resent after a lost reply, the starting publish still reads 1.
-- Times are the server's: publishers with skewed clocks agree.

local now = server_ms()
local id = redis.call('HGET', KEYS[1], 'id')
local first = now
if id then
  first = tonumber(redis.call('HGET', KEYS[1], 'first'))
  redis.call('HSET', KEYS[1], 'last', now, 'args', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'n', 1)
else
  id = ARGV[1]
  redis.call('HSET', KEYS[1], 'id', id, 'first', now, 'last', now, 'n', 1, 'args', ARGV[2],
    'route', ARGV[7])
end
local due = now + tonumber(ARGV[3])
local most = tonumber(ARGV[4])
if most > 0 and first + most < due then due = first + most end
if due < now then due = now end
redis.call('ZADD', KEYS[2], due, ARGV[6])
local keep = due - now + tonumber(ARGV[5])
redis.call('PEXPIRE', KEYS[1], keep)
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
local started = 0
if id == ARGV[1] then started = 1 end
return {id, started, due - now}
