-- sem_cancel.lua: a semaphore attempt ends without the caller knowing (or wanting) what it left
-- (see cancel.lua): its queue entry goes, and its permit is claimed (`take`) or freed and handed
-- on. Idempotent; optionally marks the attempt void (see cancel.lua).
--
-- KEYS[1..5] as sem_acquire.lua: permits, records, fence counter, queue, waiters
-- KEYS[6] <ns>:void:{name}:<attempt>
-- ARGV[1] owner id
-- ARGV[2] attempt id
-- ARGV[3] "1": a permit of this attempt is kept (claimed); "0": it is freed and handed on
-- ARGV[4] lease, ms (for a claim)
-- ARGV[5] wake channel prefix; ARGV[6] "1": SPUBLISH on the shard channel, "0": PUBLISH
-- ARGV[7] outright hand-off "1"/"0"; ARGV[8] claim window, ms
-- ARGV[9] ms to keep the attempt void ("0": not marked)
-- ARGV[10] holder metadata (for a claim)
--
-- Returns {1, token, 1} when the attempt's permit was claimed, -1 when it held none, else 0.

local owner, attempt = ARGV[1], ARGV[2]
local now = server_ms()
dequeue(KEYS[4], KEYS[5], attempt)
if tonumber(ARGV[9]) > 0 then redis.call('SET', KEYS[6], '1', 'PX', ARGV[9]) end
sem_purge(KEYS[1], KEYS[2], now)
local token, rec = sem_permit_of(KEYS[1], KEYS[2], attempt)
if not token then return -1 end
if ARGV[3] == '1' then
  token =
    sem_confirm(KEYS[1], KEYS[2], owner, attempt, tonumber(ARGV[4]), ARGV[10], now, token, rec)
  if token then
    sem_touch(KEYS[1], KEYS[2])
    return {1, tonumber(token), 1}
  end
  return -1
end
sem_forget(KEYS[1], KEYS[2], token)
sem_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], wake_to(ARGV[5], ARGV[6]), ARGV[7],
  ARGV[8], now)
return 0
