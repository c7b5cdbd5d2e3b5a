-- release.lua: drop one hold (or all holds) of the owner; at zero, hand the lock to the oldest
-- live waiter or delete it.
--
-- KEYS[1] <ns>:lock:{name}
-- KEYS[2] <ns>:fence:{name}
-- KEYS[3] <ns>:queue:{name}
-- ARGV[1] owner id
-- ARGV[2] "1" to drop every hold at once, "0" for one
-- ARGV[3] wake channel prefix "<ns>:wake:"
-- ARGV[4] "1" when PUBLISH counts every subscriber (single Redis), else "0"
-- ARGV[5] claim window of a hand-off, ms
-- ARGV[6] the calling process's token ("" for none): a waiter of that process is handed the lock
--         without a PUBLISH, and the caller wakes it (no message through Redis and back)
--
-- Returns -1 when the owner does not hold the lock (nothing is changed), else the hold count left
-- (0: released; a waiter, if any, now has it reserved); {0, waiter id, token} when it was handed
-- to a waiter of the calling process (token -1: reserved only, the waiter claims it).

local raw = redis.call('GET', KEYS[1])
local pos = owner_end(raw, ARGV[1])
if not pos then return -1 end
local last = ARGV[2] == '1' or string.sub(raw, pos, pos + 5) == '"n":1,'
-- The last hold, and nobody queued: delete it.
if last and redis.call('LLEN', KEYS[3]) == 0 then redis.call('DEL', KEYS[1]) return 0 end
-- cold: definitions used only below are created here, not by a call that returned above.
if not last then
  local n, t, at = fields_at(raw, pos)
  redis.call('SET', KEYS[1], record(ARGV[1], n - 1, t, at, nil, meta_of(raw)), 'KEEPTTL')
  return n - 1
end
local here = ARGV[6] ~= '' and ARGV[6] or nil
local token, mine = hand_off(KEYS[1], KEYS[2], KEYS[3], ARGV[3], ARGV[4], ARGV[5], here)
if mine then return {0, mine, ARGV[4] == '1' and token or -1} end
return 0
