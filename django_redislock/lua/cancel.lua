-- cancel.lua: an attempt ends without the caller knowing (or wanting) what it left in Redis: a
-- waiter's deadline, an interrupted or cancelled call, a reply that never came. Removes every
-- trace of the attempt — its queue entry, and its hold (the lock is handed on) unless `take`
-- claims it — so a lost reply never leaves a lock held for a caller that does not know it.
-- Idempotent. With ARGV[8] > 0 it also marks the attempt void for that long, so the attempt's
-- own request, should it still arrive (delayed in the network), changes nothing (acquire.lua).
--
-- KEYS[1..4] as acquire.lua: lock, fence counter, queue, waiters
-- KEYS[5] <ns>:void:{name}:<attempt>
-- ARGV[1] owner id
-- ARGV[2] attempt id
-- ARGV[3] "1": a hold of this attempt is kept (claimed: the deadline raced the hand-off);
--         "0": it is dropped and the lock handed on
-- ARGV[4] lease, ms (for a claim)
-- ARGV[5] wake channel prefix; ARGV[6] outright hand-off "1"/"0"; ARGV[7] claim window, ms
-- ARGV[8] ms to keep the attempt void ("0": not marked)
-- ARGV[9] the calling process's token ("" for none): see release.lua
--
-- Returns {1, token, hold_count} when the attempt's hold was claimed, -1 when the attempt held
-- nothing, else what release.lua returns for the dropped hold.

local owner, attempt = ARGV[1], ARGV[2]
dequeue(KEYS[3], KEYS[4], attempt)
if tonumber(ARGV[8]) > 0 then redis.call('SET', KEYS[5], '1', 'PX', ARGV[8]) end
local rec = parse(redis.call('GET', KEYS[1]), owner)
if not rec or not has_attempt(rec.a, attempt) then return -1 end
if ARGV[3] == '1' then
  local lease = math.max(tonumber(ARGV[4]), redis.call('PTTL', KEYS[1]))
  local w = rec.w
  if w == attempt then w = nil end
  redis.call('SET', KEYS[1], record(owner, rec.a, rec.t, rec.at, w, rec.m), 'PX', lease)
  return {1, tonumber(rec.t), rec.n}
end
local here = ARGV[9] ~= '' and ARGV[9] or nil
return drop_hold(KEYS, owner, rec, attempt, false, ARGV[5], ARGV[6], ARGV[7], here)
