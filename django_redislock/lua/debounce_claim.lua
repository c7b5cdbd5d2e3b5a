-- debounce_claim.lua: a delivery of a debounced task asks whether its burst's run is due, and
-- takes the burst's arguments when it is (the record is deleted: the burst is over).
--
-- KEYS[1] <ns>:debounce:{task}:<lock key>
-- KEYS[2] <ns>:debounce-due:{task}
-- ARGV[1] the delivery's flight id
-- ARGV[2] quiet period, ms
-- ARGV[3] longest wait after the first publish of a burst, ms (0: none)
-- ARGV[4] "claim" (take the arguments when due) or "peek" (read only)
-- ARGV[5] the lock key (the index member)
--
-- Returns {-1} when no burst of this id is pending (already claimed, expired, or another
-- burst's record), {ms until due} when not due yet, {0} when due (peek), {0, arguments}
-- when claimed.

local now = server_ms()
local rec = redis.call('HMGET', KEYS[1], 'id', 'first', 'last', 'args')
if rec[1] ~= ARGV[1] then return {-1} end
local due = tonumber(rec[3]) + tonumber(ARGV[2])
local most = tonumber(ARGV[3])
if most > 0 and tonumber(rec[2]) + most < due then due = tonumber(rec[2]) + most end
if due > now then return {due - now} end
if ARGV[4] ~= 'claim' then return {0} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[5])
return {0, rec[4]}
