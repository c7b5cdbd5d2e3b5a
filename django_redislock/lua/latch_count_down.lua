-- latch_count_down.lua: count a latch down by one, once per call id; the last count wakes every
-- waiter. Idempotent per call id: a resend of a call that counted (its reply was lost) finds the
-- id among the recent ones and counts nothing.
--
-- KEYS[1] <ns>:latch:{name}   hash: "n" initial count, "c" remaining count
-- KEYS[2] <ns>:latchw:{name}  waiters: waiter id -> when its entry lapses (server ms)
-- KEYS[3] <ns>:latchd:{name}  recent call ids -> the count each one left (unique: it only falls)
-- ARGV[1] initial count (used when the latch has no state yet)
-- ARGV[2] call id
-- ARGV[3] expiry of every key after this call, ms
-- ARGV[4] wake channel prefix; ARGV[5] "1": SPUBLISH on the shard channel, "0": PUBLISH
-- ARGV[6] how many recent call ids are remembered
--
-- Returns {remaining count, 1 when this call counted, else 0 (a repeat, or already at 0)}.

if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'n', ARGV[1], 'c', ARGV[1])
end
local c = tonumber(redis.call('HGET', KEYS[1], 'c'))
local counted = 0
if c > 0 and not redis.call('ZSCORE', KEYS[3], ARGV[2]) then
  c = c - 1
  counted = 1
  redis.call('HSET', KEYS[1], 'c', string.format('%d', c))
  if c > 0 then
    redis.call('ZADD', KEYS[3], c, ARGV[2])
    -- The lowest counts are the newest calls: keep those.
    redis.call('ZREMRANGEBYRANK', KEYS[3], tonumber(ARGV[6]), -1)
  else
    redis.call('DEL', KEYS[3])
    local now = server_ms()
    local wake = wake_to(ARGV[4], ARGV[5])
    for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], string.format('(%d', now), '+inf')) do
      publish_to(wake, waiter, 'r ' .. waiter .. ' 0')
    end
    redis.call('DEL', KEYS[2])
  end
end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[3]) end
return {c, counted}
