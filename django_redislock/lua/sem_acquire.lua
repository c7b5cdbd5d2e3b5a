-- sem_acquire.lua: take a permit of a semaphore, claim one reserved for this waiter, or queue.
--
-- KEYS[1] <ns>:sem:{name}     permits: fencing tokens scored by their expiry (server ms)
-- KEYS[2] <ns>:semrec:{name}  token -> record, "permits" -> limit, "w:<waiter>" -> reserved token
-- KEYS[3] <ns>:fence:{name}   fencing-token counter
-- KEYS[4] <ns>:semq:{name}    FIFO of waiter entries
-- ARGV[1] owner id
-- ARGV[2] lease, ms
-- ARGV[3] holder metadata, a JSON object
-- ARGV[4] waiter id; "" for an attempt that must not queue (non-blocking)
-- ARGV[5] how long the queue entry stays valid without a refresh, ms
-- ARGV[6] this waiter's previous queue entry ("" on its first attempt)
-- ARGV[7] permits: how many holders the caller allows at once (the limit is the caller's: a
--         lower limit than the holders' makes new acquirers wait until enough have released)
-- ARGV[8] wake channel prefix; ARGV[9] trust PUBLISH counts; ARGV[10] claim window, ms
--
-- Returns {1, token, 1} when a permit is held, {0, ms_until_the_first_permit_expires, entry}
-- when none is free (entry: this waiter's queue entry, "" when not queued).

local owner, lease, meta, waiter, prev = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[6]
local permits = tonumber(ARGV[7])
local now = server_ms()
sem_purge(KEYS[1], KEYS[2], now)
redis.call('HSET', KEYS[2], 'permits', permits)

-- The permit reserved for this waiter by a hand-off, claimed (nil when there is none).
local function claimed()
  if waiter == '' then return nil end
  local token = sem_claim(KEYS[1], KEYS[2], waiter, owner, lease, meta, now)
  if token then sem_touch(KEYS[1], KEYS[2]) end
  return token
end

local token = claimed()
if token then return {1, token, 1} end

if redis.call('ZCARD', KEYS[1]) < permits and redis.call('LLEN', KEYS[4]) > 0 then
  -- Free permits and waiters queued: the oldest live waiters come first. That may be us.
  sem_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[8], ARGV[9], ARGV[10], now)
  token = claimed()
  if token then return {1, token, 1} end
end

if redis.call('ZCARD', KEYS[1]) < permits then
  token = sem_take(KEYS[1], KEYS[2], KEYS[3], owner, lease, meta, nil, now)
  if prev ~= '' then redis.call('LREM', KEYS[4], 1, prev) end
  sem_touch(KEYS[1], KEYS[2])
  return {1, token, 1}
end

local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local soonest = math.max(0, tonumber(first[2]) - now)
sem_touch(KEYS[1], KEYS[2])
if waiter == '' then return {0, soonest, ''} end
local entry = enqueue(KEYS[4], tonumber(ARGV[5]), waiter, owner, lease, meta, prev, now)
return {0, soonest, entry}
