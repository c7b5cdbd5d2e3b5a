-- rate.lua: one rate-limit decision by GCRA (the generic cell rate algorithm), on the server's clock.
--
-- KEYS[1] <ns>:rate:{name}: the theoretical arrival time (TAT) in microseconds, as a plain
--         integer string that expires when the limiter is fully rested (the layout of the GCRA
--         command some servers have, so either may decide on the same key)
-- ARGV[1] burst: how many requests may pass at once after a quiet period (>= 1)
-- ARGV[2] emission interval in microseconds (the rate's period / its count, >= 1)
-- ARGV[3] n: requests this decision is for (1 <= n <= burst)
-- ARGV[4] now in microseconds; 0 (always, but in tests): the server's TIME
-- ARGV[5] reserve: 0, or the longest wait in microseconds a refused request may instead *book*:
--         its place is taken now, at the time it will conform (a task re-published for then)
--
-- Returns {allowed 1|0|2 (2: booked), remaining, retry_after_us (0 when allowed; when booked:
-- the wait until the booked place), reset_after_us}.
-- A refused decision writes nothing, so repeating any call after a lost reply is safe but for
-- an allowed one, which is counted twice: the limiter then errs on the strict side.

local now = tonumber(ARGV[4])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local burst = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then tat = now end  -- rested (or not a TAT: written by something else)
local variance = interval * burst
local new_tat = tat + interval * n
local early = new_tat - variance - now  -- > 0: how long before these n would conform
local reserve = tonumber(ARGV[5] or '0')
local allowed, ttl, retry = 1, new_tat - now, 0
if early > 0 then
  if early <= reserve then
    allowed, retry = 2, early  -- booked: the place is taken now, for then
  else
    allowed, ttl, retry = 0, tat - now, early
  end
end
if allowed ~= 0 then
  redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil(ttl / 1000))
end
local spare = variance - ttl
local remaining = 0
if spare > 0 then remaining = math.floor(spare / interval) end
return {allowed, remaining, retry, ttl}
