-- acquire.lua: take a free lock, re-enter or claim a lock of this owner, or queue behind the holder.
--
-- KEYS[1] <ns>:lock:{name}   the lock (JSON record, PX = lease)
-- KEYS[2] <ns>:fence:{name}  fencing-token counter
-- KEYS[3] <ns>:queue:{name}  FIFO of waiter entries
-- ARGV[1] owner id
-- ARGV[2] lease, ms
-- ARGV[3] holder metadata, a JSON object (replaces the stored one on re-entry and claim)
-- ARGV[4] waiter id; "" for an attempt that must not queue (non-blocking)
-- ARGV[5] how long the queue entry stays valid without a refresh, ms
-- ARGV[6] this waiter's previous queue entry ("" on its first attempt)
-- ARGV[7] "1" to refuse re-entry (reentrant=False), else "0"
-- ARGV[8] wake channel prefix "<ns>:wake:" (channels are not keys: nothing outside the slot)
-- ARGV[9] "1" when PUBLISH counts every subscriber (single Redis), else "0" (see hand_off)
-- ARGV[10] claim window of a hand-off, ms
--
-- Returns token (an integer) when a free lock was taken (hold count 1: the common case, so the
-- cheapest reply; the client reads it as {1, token, 1}),
-- {1, token, hold_count} when held otherwise (re-entered, or a hand-off claimed),
-- {0, holder_pttl_ms, entry} when busy (entry: this waiter's queue entry, "" when not queued),
-- {2, token, hold_count} when this owner holds it already and re-entry was refused.

local owner, lease, waiter, prev = ARGV[1], ARGV[2], ARGV[4], ARGV[6]
local raw = redis.call('GET', KEYS[1])
-- Free and nobody queued (so no entry of ours to remove either): take it.
if not raw and redis.call('LLEN', KEYS[3]) == 0 then
  return take(KEYS[1], KEYS[2], owner, lease, ARGV[3])
end
-- cold: definitions used only below are created here, not by a call that returned above.
if not raw then
  -- Free with waiters queued (the holder's lease ran out, or a hand-off went unclaimed): the
  -- oldest live waiter gets it, exactly as if it had just been released. That may be us.
  hand_off(KEYS[1], KEYS[2], KEYS[3], ARGV[8], ARGV[9], ARGV[10])
  raw = redis.call('GET', KEYS[1])
  -- Still free: nobody live waited, and the queue is empty now.
  if not raw then return take(KEYS[1], KEYS[2], owner, lease, ARGV[3]) end
end

local pos = owner_end(raw, owner)
if pos then
  local n, t, at = fields_at(raw, pos)
  if waiter ~= '' and reserved_for(raw, waiter) then
    redis.call('SET', KEYS[1], record(owner, n, t, at, nil, ARGV[3]), 'PX', lease)
    return {1, t, n}
  end
  if ARGV[7] == '1' then return {2, t, n} end
  redis.call('SET', KEYS[1], record(owner, n + 1, t, at, nil, ARGV[3]), 'PX', lease)
  return {1, t, n + 1}
end

local pttl = redis.call('PTTL', KEYS[1])
if waiter == '' then return {0, pttl, ''} end

local entry = enqueue(KEYS[3], tonumber(ARGV[5]), waiter, owner, lease, ARGV[3], prev, server_ms())
return {0, pttl, entry}
