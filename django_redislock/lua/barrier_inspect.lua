-- barrier_inspect.lua: a barrier's parties, live arrived parties and whether it is broken,
-- writing nothing.
--
-- KEYS[1] <ns>:barrier:{name}   hash: "p" parties, "b" "0", or why the barrier is broken
-- KEYS[2] <ns>:barrierw:{name}  the parties of the current round: waiter id -> lease end (ms)
--
-- Returns {parties (-1: no state), live arrived parties, 1 when broken (or a party's lease ended
-- and the next call will break it) else 0}.

local p = redis.call('HGET', KEYS[1], 'p')
if not p then return {-1, 0, 0} end
local now = server_ms()
local live = redis.call('ZCOUNT', KEYS[2], string.format('(%d', now), '+inf')
local b = redis.call('HGET', KEYS[1], 'b')
local broken = 0
if (b and b ~= '0') or redis.call('ZCOUNT', KEYS[2], '-inf', now) > 0 then broken = 1 end
return {tonumber(p), live, broken}
