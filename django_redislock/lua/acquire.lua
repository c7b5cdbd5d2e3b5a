-- acquire.lua: take a free lock, re-enter a lock this owner holds, or queue behind the holder.
--
-- KEYS[1] <ns>:lock:{name}          the lock (JSON record, PX = lease)
-- KEYS[2] <ns>:fence:{name}         fencing-token counter
-- KEYS[3] <ns>:queue:{name}         FIFO of waiter entries
-- KEYS[4] <ns>:wake:{name}:<waiter> this waiter's mailbox (a hand-off pushes its token here)
-- ARGV[1] owner id
-- ARGV[2] lease, ms
-- ARGV[3] holder metadata, a JSON object
-- ARGV[4] waiter id; "" for a non-blocking attempt (never queued)
-- ARGV[5] how long the queue entry stays valid without a refresh, ms
-- ARGV[6] this waiter's previous queue entry ("" on the first attempt)
-- ARGV[7] client clock, epoch ms (acquired-at of a fresh acquisition)
--
-- Returns {1, token, hold_count} when held, {0, holder_pttl_ms, entry} when busy
-- (entry: this waiter's current queue entry, "" when not queued).

local owner, lease, prev = ARGV[1], ARGV[2], ARGV[6]
if prev ~= '' then
  -- A release may have handed us the lock after our last wait timed out.
  local handed = redis.call('LPOP', KEYS[4])
  if handed then return {1, tonumber(handed), 1} end
end

local raw = redis.call('GET', KEYS[1])
if not raw then
  local token = next_token(KEYS[2])
  redis.call('SET', KEYS[1], record(owner, 1, token, tonumber(ARGV[7]), ARGV[3]), 'PX', lease)
  if prev ~= '' then redis.call('LREM', KEYS[3], 1, prev) end
  return {1, token, 1}
end

if owned_by(raw, owner) then
  -- Re-entry: the newest acquirer's metadata replaces the old (a Celery worker re-entering the
  -- hold its publisher took shows itself, not the publisher).
  local rec = cjson.decode(raw)
  local count = rec.n + 1
  redis.call('SET', KEYS[1], record(owner, count, rec.t, rec.at, ARGV[3]), 'PX', lease)
  return {1, rec.t, count}
end

local pttl = redis.call('PTTL', KEYS[1])
if ARGV[4] == '' then return {0, pttl, ''} end

local entry_lease = tonumber(ARGV[5])
local entry = string.format('%d\n%s\n%s\n%s\n%s', server_ms() + entry_lease, lease, ARGV[4],
  owner, ARGV[3])
local pos = false
if prev ~= '' then pos = redis.call('LPOS', KEYS[3], prev) end
if pos then
  redis.call('LSET', KEYS[3], pos, entry)
else
  redis.call('RPUSH', KEYS[3], entry)
end
redis.call('PEXPIRE', KEYS[3], entry_lease)
return {0, pttl, entry}
