-- sem_renew.lua: reset (or extend) the lease of one permit this owner holds.
--
-- KEYS[1] <ns>:sem:{name}; KEYS[2] <ns>:semrec:{name}
-- ARGV[1] owner id
-- ARGV[2] the permit's fencing token
-- ARGV[3] milliseconds
-- ARGV[4] "set": the lease becomes ARGV[3]; "add": ARGV[3] is added to the remaining lease
--
-- Returns 1 when renewed, 0 when the owner no longer holds that permit.

local now = server_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[2])
local rec = redis.call('HGET', KEYS[2], ARGV[2])
if not score or tonumber(score) <= now or not rec or not owned_by(rec, ARGV[1]) then
  return 0
end
local expiry = now + tonumber(ARGV[3])
if ARGV[4] == 'add' then expiry = tonumber(score) + tonumber(ARGV[3]) end
redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[2])
expire_fields(KEYS[2], expiry, ARGV[2], 'a:' .. attempt_of(rec))
sem_touch(KEYS[1], KEYS[2])
return 1
