-- sem_acquire.lua: take a permit of a semaphore, claim one handed to this attempt, or queue.
-- Idempotent per attempt: a repeat finds the attempt's permit (or queue entry).
--
-- KEYS[1] <ns>:sem:{name}     permits: fencing tokens scored by their expiry (server ms)
-- KEYS[2] <ns>:semrec:{name}  token -> record, "permits" -> limit, "a:<attempt>" -> token
-- KEYS[3] <ns>:fence[:{name}] fencing-token counter
-- KEYS[4] <ns>:semq:{name}    waiter ids, oldest first
-- KEYS[5] <ns>:semw:{name}    waiter id -> queue entry details
-- KEYS[6] <ns>:void:{name}:<attempt>  exists once this attempt was cancelled
-- ARGV[1] owner id
-- ARGV[2] lease, ms
-- ARGV[3] holder metadata, a JSON object
-- ARGV[4] attempt id (also the waiter id)
-- ARGV[5] "1" to queue when busy, else "0"
-- ARGV[6] how long the queue entry stays valid without a refresh, ms
-- ARGV[7] permits: how many holders the caller allows at once (the limit is the caller's: a
--         lower limit than the holders' makes new acquirers wait until enough have released)
-- ARGV[8] wake channel prefix; ARGV[9] "1": SPUBLISH on the shard channel, "0": PUBLISH
-- ARGV[10] outright hand-off "1"/"0"; ARGV[11] claim window, ms
--
-- Returns {1, token, 1} when a permit is held, {0, ms_until_the_first_permit_expires, queued}
-- when none is free, {3} when this attempt was cancelled before this call arrived.

local owner, lease, meta, attempt = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local permits = tonumber(ARGV[7])
if redis.call('EXISTS', KEYS[6]) == 1 then return {3} end
local now = server_ms()
sem_purge(KEYS[1], KEYS[2], now)
redis.call('HSET', KEYS[2], 'permits', permits)

-- The permit of this attempt (handed to it, or a repeat), confirmed with the full lease.
local function confirmed()
  local token, rec = sem_permit_of(KEYS[1], KEYS[2], attempt)
  if not token then return nil end
  dequeue(KEYS[4], KEYS[5], attempt)
  token = sem_confirm(KEYS[1], KEYS[2], owner, attempt, lease, meta, now, token, rec)
  if token then sem_touch(KEYS[1], KEYS[2]) end
  return token
end

local token = confirmed()
if token then return {1, tonumber(token), 1} end

if redis.call('ZCARD', KEYS[1]) < permits and redis.call('LLEN', KEYS[4]) > 0 then
  -- Free permits and waiters queued: the oldest live waiters come first. That may be us.
  sem_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], wake_to(ARGV[8], ARGV[9]), ARGV[10],
    ARGV[11], now)
  token = confirmed()
  if token then return {1, tonumber(token), 1} end
end

if redis.call('ZCARD', KEYS[1]) < permits then
  token = sem_take(KEYS[1], KEYS[2], owner, attempt, lease, meta, false, now, next_token(KEYS[3]))
  dequeue(KEYS[4], KEYS[5], attempt)
  sem_touch(KEYS[1], KEYS[2])
  return {1, tonumber(token), 1}
end

local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local soonest = math.max(0, tonumber(first[2]) - now)
sem_touch(KEYS[1], KEYS[2])
if ARGV[5] ~= '1' then return {0, soonest, 0} end
enqueue(KEYS[4], KEYS[5], attempt, owner, lease, meta, tonumber(ARGV[6]), now)
return {0, soonest, 1}
