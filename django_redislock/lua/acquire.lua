-- acquire.lua: take a free lock, re-enter or claim a lock of this owner, or queue behind the holder.
-- Idempotent per attempt: a repeat of the same attempt (a resend after a lost reply) finds its
-- hold, or its queue entry, and changes nothing but the lease.
--
-- KEYS[1] <ns>:lock:{name}     the lock (JSON record, PX = lease)
-- KEYS[2] <ns>:fence[:{name}]  fencing-token counter
-- KEYS[3] <ns>:queue:{name}    waiter ids, oldest first
-- KEYS[4] <ns>:waiters:{name}  waiter id -> queue entry details
-- KEYS[5] <ns>:void:{name}:<attempt>  exists once this attempt was cancelled (cancel.lua)
-- ARGV[1] owner id
-- ARGV[2] lease, ms
-- ARGV[3] holder metadata, a JSON object (replaces the stored one on re-entry and claim)
-- ARGV[4] attempt id ("<process token>.<n>"), also the waiter id
-- ARGV[5] "1" to queue when busy (a blocking attempt whose process listens), else "0"
-- ARGV[6] how long the queue entry stays valid without a refresh, ms
-- ARGV[7] "1" to refuse re-entry (reentrant=False), else "0"
-- ARGV[8] wake channel prefix: "<ns>:wake:", or "<ns>:wake:{name}:" with ARGV[9] "1"
-- ARGV[9] "1" to SPUBLISH on the shard channel of the lock's slot, "0" to PUBLISH (see wake_to)
-- ARGV[10] "1" when a hand-off is outright (see hand_off), else "0"
-- ARGV[11] claim window of a hand-off, ms
-- ARGV[12] what the caller knows of its holds: "" (an owner shared between processes: the
--         record is the truth), "-" (this process holds nothing under this owner) or the
--         attempt id of the hold it knows. A record of the owner that the caller does not know
--         is an orphan of this very owner — an attempt it gave up on, whose clean-up has not
--         run, or a queue entry a lossy failover brought back — and is replaced, never re-entered.
--
-- Returns {1, token, hold_count} when held (taken, re-entered, claimed, or already held by this
-- attempt), {0, holder_pttl_ms, queued} when busy (queued: 1 when this attempt waits in the
-- queue), {2, token, hold_count} when this owner holds it and re-entry was refused, {3} when
-- this attempt was cancelled before this call arrived (nothing is changed).

local owner, lease, meta, attempt = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
if redis.call('EXISTS', KEYS[5]) == 1 then return {3} end
local raw = redis.call('GET', KEYS[1])
if not raw then
  if redis.call('LLEN', KEYS[3]) > 0 then
    -- Free with waiters queued (a lease ran out, or a hand-off went unclaimed): the oldest live
    -- waiter gets it, exactly as if it had just been released. That may be this attempt.
    hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], wake_to(ARGV[8], ARGV[9]), ARGV[10], ARGV[11])
    raw = redis.call('GET', KEYS[1])
    if not raw then dequeue(KEYS[3], KEYS[4], attempt) end
  end
  if not raw then
    local token = next_token(KEYS[2])
    redis.call('SET', KEYS[1], record(owner, attempt, token, server_ms(), nil, meta), 'PX', lease)
    return {1, tonumber(token), 1}
  end
end

local rec = parse(raw, owner)
if rec then
  -- Never shorten the lease: a nested hold with a shorter timeout keeps the outer one's.
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > lease then lease = pttl end
  if has_attempt(rec.a, attempt) then
    -- Handed to this attempt (claimed now), or a repeat of it: held, nothing added.
    dequeue(KEYS[3], KEYS[4], attempt)
    local w = rec.w
    if w == attempt then w = nil end
    redis.call('SET', KEYS[1], record(owner, rec.a, rec.t, rec.at, w, meta), 'PX', lease)
    return {1, tonumber(rec.t), rec.n}
  end
  local known = ARGV[12]
  if known ~= '' and (known == '-' or not has_attempt(rec.a, known) or rec.w) then
    local token = next_token(KEYS[2])
    redis.call('SET', KEYS[1], record(owner, attempt, token, server_ms(), nil, meta), 'PX',
      tonumber(ARGV[2]))
    return {1, tonumber(token), 1}
  end
  if rec.w then
    -- Reserved for another attempt of a shared owner, not yet claimed: not a hold to nest in.
    local pttl = redis.call('PTTL', KEYS[1])
    if ARGV[5] ~= '1' then return {0, pttl, 0} end
    enqueue(KEYS[3], KEYS[4], attempt, owner, lease, meta, tonumber(ARGV[6]), server_ms())
    return {0, pttl, 1}
  end
  if ARGV[7] == '1' then return {2, tonumber(rec.t), rec.n} end
  redis.call('SET', KEYS[1], record(owner, rec.a .. ' ' .. attempt, rec.t, rec.at, nil, meta),
    'PX', lease)
  return {1, tonumber(rec.t), rec.n + 1}
end

local pttl = redis.call('PTTL', KEYS[1])
if ARGV[5] ~= '1' then return {0, pttl, 0} end
enqueue(KEYS[3], KEYS[4], attempt, owner, lease, meta, tonumber(ARGV[6]), server_ms())
return {0, pttl, 1}
