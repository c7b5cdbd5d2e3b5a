-- rw_acquire.lua: take the read or the write lock of a read-write lock, re-enter it, or queue.
-- Any number of readers (one lease each) or one writer; a waiting writer blocks new readers;
-- writers go in queue order; a writer may also read (downgrade); a reader asking to write is
-- refused at once (two readers upgrading would wait for each other for ever). Idempotent per
-- attempt, like acquire.lua.
--
-- KEYS[1] <ns>:rw:{name}      the writer's record (PX = lease)
-- KEYS[2] <ns>:rwr:{name}     readers: owner -> lease end (server ms)
-- KEYS[3] <ns>:rwrec:{name}   readers' records: owner -> record
-- KEYS[4] <ns>:fence[:{name}] fencing-token counter
-- KEYS[5] <ns>:rwq:{name}     waiter ids, oldest first
-- KEYS[6] <ns>:rwwait:{name}  waiter id -> queue entry details; "w:<id>" for writers
-- KEYS[7] <ns>:void:{name}:<attempt>
-- ARGV[1] owner id; ARGV[2] lease, ms; ARGV[3] metadata (JSON); ARGV[4] attempt id
-- ARGV[5] "1" to queue when busy; ARGV[6] queue entry validity, ms
-- ARGV[7] "w" to write, "r" to read
-- ARGV[8] what the caller knows of the owner's holds, "<this side>,<other side>" (each as
--         acquire.lua's ARGV[11]), or "" (an owner shared between processes: records are truth)
--
-- Returns {1, token, hold_count} when held, {0, wait_ms, queued} when busy (wait_ms: until the
-- first hold in the way ends, -1 when a waiting writer is in the way), {2, 0, 0} when the owner
-- reads and asks to write, {3} when the attempt was cancelled before this call arrived.

local owner, lease, meta, attempt = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local writes = ARGV[7] == 'w'
local known, other = string.match(ARGV[8], '^([^,]*),(.*)$')
if not known then known, other = ARGV[8], ARGV[8] end

-- Whether a record of this owner is the caller's own hold (not an orphan: see acquire.lua).
local function ours(rec, knows)
  return knows == '' or (knows ~= '-' and has_attempt(rec.a, knows))
end
if redis.call('EXISTS', KEYS[7]) == 1 then return {3} end
local now = server_ms()
rw_purge(KEYS, now)
local wraw = redis.call('GET', KEYS[1])

-- This owner's hold in this mode: a repeat of the attempt, a re-entry, or an orphan (a hold of
-- an attempt the caller gave up on) that is replaced.
local rec = parse(rw_raw(KEYS, owner, writes), owner)
if rec and not has_attempt(rec.a, attempt) and not ours(rec, known) then rec = nil end
if rec then
  local attempts, n = rec.a, rec.n
  if has_attempt(attempts, attempt) then
    rw_dequeue(KEYS, attempt)
  else
    attempts, n = attempts .. ' ' .. attempt, n + 1
  end
  local value = record(owner, attempts, rec.t, rec.at, nil, meta)
  if writes then
    redis.call('SET', KEYS[1], value, 'PX', math.max(redis.call('PTTL', KEYS[1]), lease))
  else
    local ends = math.max(tonumber(redis.call('ZSCORE', KEYS[2], owner)) or 0, now + lease)
    redis.call('HSET', KEYS[3], owner, value)
    redis.call('ZADD', KEYS[2], ends, owner)
    expire_fields(KEYS[3], ends, owner)
    rw_touch(KEYS)
  end
  return {1, tonumber(rec.t), n}
end

local wait_ms = nil
local wrec = parse(wraw, owner)
local mine = wrec ~= nil and ours(wrec, other)
if writes then
  local rrec = parse(redis.call('HGET', KEYS[3], owner), owner)
  if wraw and not wrec then
    wait_ms = redis.call('PTTL', KEYS[1])
  elseif rrec and ours(rrec, other) then
    return {2, 0, 0}
  elseif redis.call('ZCARD', KEYS[2]) > 0 then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    wait_ms = math.max(1, tonumber(first[2]) - now)
  elseif rw_blocked(KEYS, attempt, true, now) then
    wait_ms = -1
  end
elseif not mine then
  if wraw then
    wait_ms = redis.call('PTTL', KEYS[1])
  elseif rw_blocked(KEYS, attempt, false, now) then
    wait_ms = -1
  end
end

if wait_ms then
  local queued = 0
  if ARGV[5] == '1' then
    enqueue(KEYS[5], KEYS[6], attempt, owner, lease, meta, tonumber(ARGV[6]), now)
    if writes then redis.call('HSET', KEYS[6], 'w:' .. attempt, '1') end
    queued = 1
  end
  return {0, wait_ms, queued}
end

local token = next_token(KEYS[4])
local value = record(owner, attempt, token, now, nil, meta)
rw_dequeue(KEYS, attempt)
if writes then
  redis.call('SET', KEYS[1], value, 'PX', lease)
else
  redis.call('HSET', KEYS[3], owner, value)
  redis.call('ZADD', KEYS[2], now + lease, owner)
  expire_fields(KEYS[3], now + lease, owner)
  rw_touch(KEYS)
end
return {1, tonumber(token), 1}
