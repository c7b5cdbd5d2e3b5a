-- sem_release.lua: give back one permit of this owner; free permits go to the oldest waiters.
-- Idempotent: a permit is given back once.
--
-- KEYS[1] <ns>:sem:{name}; KEYS[2] <ns>:semrec:{name}; KEYS[3] <ns>:fence[:{name}];
-- KEYS[4] <ns>:semq:{name}; KEYS[5] <ns>:semw:{name}
-- ARGV[1] owner id
-- ARGV[2] the permit's fencing token
-- ARGV[3] wake channel prefix; ARGV[4] "1": SPUBLISH on the shard channel, "0": PUBLISH
-- ARGV[5] outright hand-off "1"/"0"; ARGV[6] claim window, ms
--
-- Returns -1 when the owner does not hold that permit (expired, force-released, never taken;
-- nothing is changed), else 0.

local now = server_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[2])
local rec = redis.call('HGET', KEYS[2], ARGV[2])
if not score or tonumber(score) <= now or not rec or not owned_by(rec, ARGV[1]) then
  return -1
end
sem_forget(KEYS[1], KEYS[2], ARGV[2])
sem_purge(KEYS[1], KEYS[2], now)
sem_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], wake_to(ARGV[3], ARGV[4]), ARGV[5],
  ARGV[6], now)
return 0
