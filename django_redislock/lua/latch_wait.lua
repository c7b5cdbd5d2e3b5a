-- latch_wait.lua: look at a latch for a waiter, and keep (or drop) the waiter's entry, so that
-- the last count-down wakes it. Idempotent per waiter id.
--
-- KEYS[1] <ns>:latch:{name}   hash: "n" initial count, "c" remaining count
-- KEYS[2] <ns>:latchw:{name}  waiters: waiter id -> when its entry lapses (server ms)
-- KEYS[3] <ns>:latchd:{name}  recent count-down ids (only its expiry is refreshed here)
-- ARGV[1] initial count (used when the latch has no state yet)
-- ARGV[2] waiter id: "<process token>.<n>", its process listens on <prefix><process token>
-- ARGV[3] "1": stay a waiter while the count is above 0; "0": not (a first look, or the last)
-- ARGV[4] how long the waiter's entry stays valid without a refresh, ms
-- ARGV[5] expiry of every key after this call, ms
--
-- Returns the remaining count (0: the latch is open).

if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'n', ARGV[1], 'c', ARGV[1])
end
local c = tonumber(redis.call('HGET', KEYS[1], 'c'))
local now = server_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if c > 0 and ARGV[3] == '1' then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[2])
else
  redis.call('ZREM', KEYS[2], ARGV[2])
end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return c
