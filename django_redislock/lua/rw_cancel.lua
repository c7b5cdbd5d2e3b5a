-- rw_cancel.lua: an attempt on a read-write lock ends without the caller knowing (or wanting)
-- what it left: its queue entry goes, and its hold is dropped unless `take` claims it (the
-- deadline raced a wake-up). Idempotent; see cancel.lua.
--
-- KEYS[1..6] as rw_acquire.lua; KEYS[7] <ns>:void:{name}:<attempt>
-- ARGV[1] owner id; ARGV[2] attempt id; ARGV[3] "1" to keep (claim) the attempt's hold
-- ARGV[4] lease, ms (for a claim); ARGV[5] wake channel prefix; ARGV[6] "1": SPUBLISH on the
-- shard channel, "0": PUBLISH (ARGV[7], ARGV[8]: cancel.lua's hand-off arguments, unused:
-- read-write waiters re-check, nothing is handed over)
-- ARGV[9] ms to keep the attempt void ("0": not marked); ARGV[10] "w" or "r"
--
-- Returns {1, token, hold_count} when claimed, -1 when the attempt held nothing, else the
-- owner's holds left in this mode.

local owner, attempt, writes = ARGV[1], ARGV[2], ARGV[10] == 'w'
local wake = wake_to(ARGV[5], ARGV[6])
local now = server_ms()
rw_purge(KEYS, now)
if tonumber(ARGV[9]) > 0 then redis.call('SET', KEYS[7], '1', 'PX', ARGV[9]) end
if rw_dequeue(KEYS, attempt) then rw_wake(KEYS, wake, now) end
local rec = parse(rw_raw(KEYS, owner, writes), owner)
if not rec or not has_attempt(rec.a, attempt) then return -1 end
if ARGV[3] == '1' then
  local lease = tonumber(ARGV[4])
  if writes then
    redis.call('PEXPIRE', KEYS[1], math.max(lease, redis.call('PTTL', KEYS[1])))
  else
    local ends = math.max(tonumber(redis.call('ZSCORE', KEYS[2], owner)) or 0, now + lease)
    redis.call('ZADD', KEYS[2], ends, owner)
    expire_fields(KEYS[3], ends, owner)
    rw_touch(KEYS)
  end
  return {1, tonumber(rec.t), rec.n}
end
return rw_drop(KEYS, owner, writes, attempt, false, wake, now)
