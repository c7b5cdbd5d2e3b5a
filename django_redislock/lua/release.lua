-- release.lua: drop one hold (or every hold) of the owner; at zero, hand the lock to the oldest
-- live waiter or delete it. Idempotent per attempt: the hold of an attempt is dropped once.
--
-- KEYS[1] <ns>:lock:{name}
-- KEYS[2] <ns>:fence[:{name}]
-- KEYS[3] <ns>:queue:{name}
-- KEYS[4] <ns>:waiters:{name}
-- ARGV[1] owner id
-- ARGV[2] attempt id of the hold to drop ("": the newest hold, for a release by another process
--         than the one that acquired, which does not know the attempt)
-- ARGV[3] "1" to drop every hold at once, "0" for one
-- ARGV[4] wake channel prefix; ARGV[5] "1": SPUBLISH on the lock's shard channel, "0": PUBLISH
-- ARGV[6] "1" when a hand-off is outright, else "0"
-- ARGV[7] claim window of a hand-off, ms
-- ARGV[8] the calling process's token ("" for none): a waiter of that process is handed the lock
--         without a PUBLISH, and the caller wakes it
--
-- Returns -1 when the owner does not hold the lock (by that attempt; nothing is changed), else
-- the hold count left (0: released; a waiter, if any, now has it); {0, waiter id, token} when it
-- was handed to a waiter of the calling process (token -1: reserved only, the waiter claims it).

local rec = parse(redis.call('GET', KEYS[1]), ARGV[1])
if not rec then return -1 end
local here = ARGV[8] ~= '' and ARGV[8] or nil
local wake = wake_to(ARGV[4], ARGV[5])
return drop_hold(KEYS, ARGV[1], rec, ARGV[2], ARGV[3] == '1', wake, ARGV[6], ARGV[7], here)
