-- cancel.lua: an attempt ends without the caller knowing (or wanting) what it left in Redis: a
-- waiter's deadline, an interrupted or cancelled call, a reply that never came. Removes every
-- trace of the attempt — its queue entry, and its hold (the lock is handed on) unless `take`
-- claims it — so a lost reply never leaves a lock held for a caller that does not know it.
-- Idempotent. With ARGV[9] > 0 it also marks the attempt void for that long, so the attempt's
-- own request, should it still arrive (delayed in the network), changes nothing (acquire.lua).
--
-- KEYS[1..4] as acquire.lua: lock, fence counter, queue, waiters
-- KEYS[5] <ns>:void:{name}:<attempt>
-- ARGV[1] owner id
-- ARGV[2] attempt id
-- ARGV[3] "1": a hold of this attempt is kept (claimed: the deadline raced the hand-off);
--         "0": it is dropped and the lock handed on
-- ARGV[4] lease, ms (for a claim)
-- ARGV[5] wake channel prefix; ARGV[6] "1": SPUBLISH on the lock's shard channel, "0": PUBLISH
-- ARGV[7] outright hand-off "1"/"0"; ARGV[8] claim window, ms
-- ARGV[9] ms to keep the attempt void ("0": not marked)
-- ARGV[10] the calling process's token ("" for none): see release.lua
--
-- Returns {1, token, hold_count} when the attempt's hold was claimed, -1 when the attempt held
-- nothing, else what release.lua returns for the dropped hold.

local owner, attempt = ARGV[1], ARGV[2]
dequeue(KEYS[3], KEYS[4], attempt)
if tonumber(ARGV[9]) > 0 then redis.call('SET', KEYS[5], '1', 'PX', ARGV[9]) end
local rec = parse(redis.call('GET', KEYS[1]), owner)
if not rec or not has_attempt(rec.a, attempt) then return -1 end
if ARGV[3] == '1' then
  local lease = math.max(tonumber(ARGV[4]), redis.call('PTTL', KEYS[1]))
  local w = rec.w
  if w == attempt then w = nil end
  redis.call('SET', KEYS[1], record(owner, rec.a, rec.t, rec.at, w, rec.m), 'PX', lease)
  return {1, tonumber(rec.t), rec.n}
end
local here = ARGV[10] ~= '' and ARGV[10] or nil
return drop_hold(KEYS, owner, rec, attempt, false, wake_to(ARGV[5], ARGV[6]), ARGV[7], ARGV[8],
  here)
