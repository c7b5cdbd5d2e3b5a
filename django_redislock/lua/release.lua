-- release.lua: drop one hold (or all holds) of the owner; at zero, hand the lock to the oldest
-- live waiter or delete it.
--
-- KEYS[1] <ns>:lock:{name}
-- KEYS[2] <ns>:fence:{name}
-- KEYS[3] <ns>:queue:{name}
-- ARGV[1] owner id
-- ARGV[2] "1" to drop every hold at once, "0" for one
-- ARGV[3] wake-key prefix "<ns>:wake:{name}:" (same hash slot as KEYS[1])
--
-- Returns -1 when the owner does not hold the lock (nothing is changed), else the hold count left
-- (0: released; a waiter, if any, now holds it).

local raw = redis.call('GET', KEYS[1])
if not owned_by(raw, ARGV[1]) then return -1 end
if ARGV[2] ~= '1' then
  local rec = cjson.decode(raw)
  if rec.n > 1 then
    redis.call('SET', KEYS[1], record(ARGV[1], rec.n - 1, rec.t, rec.at, meta_of(raw)), 'KEEPTTL')
    return rec.n - 1
  end
end
hand_off(KEYS[1], KEYS[2], KEYS[3], ARGV[3])
return 0
