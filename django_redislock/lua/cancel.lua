-- cancel.lua: a waiter stops waiting (deadline reached, or interrupted).
--
-- KEYS[1] <ns>:lock:{name}
-- KEYS[2] <ns>:fence:{name}
-- KEYS[3] <ns>:queue:{name}
-- ARGV[1] the waiter's current queue entry ("" when it has none)
-- ARGV[2] waiter id
-- ARGV[3] owner id
-- ARGV[4] lease, ms
-- ARGV[5] "1": a hand-off reserved for this waiter is claimed (the deadline raced the release);
--         "0": it is passed on to the next waiter (the waiter was interrupted)
-- ARGV[6] wake channel prefix; ARGV[7] trust PUBLISH counts; ARGV[8] claim window, ms
--
-- Returns {1, token, hold_count} when a reserved hand-off was claimed (the caller holds the lock),
-- else {0} (the entry is gone from the queue and the caller holds nothing).

local raw = redis.call('GET', KEYS[1])
local pos = owner_end(raw, ARGV[3])
if pos and reserved_for(raw, ARGV[2]) then
  local n, t, at = fields_at(raw, pos)
  if ARGV[5] == '1' then
    redis.call('SET', KEYS[1], record(ARGV[3], n, t, at, nil, meta_of(raw)), 'PX', ARGV[4])
    return {1, t, n}
  end
  hand_off(KEYS[1], KEYS[2], KEYS[3], ARGV[6], ARGV[7], ARGV[8])
  return {0}
end
if ARGV[1] ~= '' then redis.call('LREM', KEYS[3], 1, ARGV[1]) end
return {0}
