-- _library.lua: functions shared by the scripts (the definitions a script uses are prepended to
-- it on its first line, so error line numbers stay those of the script's own file).
--
-- A lock's value is one JSON object, always written by record(), so its layout is fixed:
--   {"o": owner, "n": hold count, "t": fencing token, "at": acquired-at (server epoch ms),
--    "a": "<attempt id> ...", ["w": attempt id of a hand-off not yet claimed,] "m": {metadata}}
-- "a" names the acquisition attempt behind each hold, oldest first (n words): a repeat of an
-- attempt (a resend after a lost reply) is recognised and never adds a hold, and a hold can be
-- dropped by its attempt id (cleaning up an attempt whose outcome the client never learnt).
-- "m" comes last and is kept as the raw JSON the client sent. Field values are JSON-encoded,
-- so the quoted markers searched for below occur only as structure, never inside a string.
-- Attempt ids are "<process token>.<n>": no spaces, quotes or backslashes.

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function record(owner, attempts, token, at, waiter, meta)
  local n = 1
  for _ in string.gmatch(attempts, ' ') do n = n + 1 end
  local w = ''
  if waiter then w = ',"w":"' .. waiter .. '"' end
  return string.format('{"o":%s,"n":%d,"t":%s,"at":%d,"a":"%s"%s,"m":%s}', cjson.encode(owner), n,
    token, at, attempts, w, meta)
end

-- Whether the record belongs to `owner` (a prefix compare).
local function owned_by(raw, owner)
  if not raw then return false end
  local prefix = '{"o":' .. cjson.encode(owner) .. ','
  return string.sub(raw, 1, #prefix) == prefix
end

-- The record's fields when it belongs to `owner` (a prefix compare: no JSON decoding), else nil.
-- A record written before attempt ids existed has anonymous holds ("-").
local function parse(raw, owner)
  if not raw then return nil end
  local prefix = '{"o":' .. cjson.encode(owner) .. ','
  if string.sub(raw, 1, #prefix) ~= prefix then return nil end
  local _, stop, n, t, at = string.find(raw, '^"n":(%d+),"t":(%d+),"at":(%d+)', #prefix + 1)
  if not n then return nil end
  local rec = {n = tonumber(n), t = t, at = tonumber(at)}
  rec.a = string.match(raw, '^,"a":"([^"]*)"', stop + 1)
  if not rec.a then rec.a = string.rep('- ', rec.n - 1) .. '-' end
  rec.w = string.match(raw, ',"w":"([^"]*)",')
  local m = string.find(raw, ',"m":', 1, true)
  rec.m = string.sub(raw, m + 5, -2)
  return rec
end

local function has_attempt(attempts, attempt)
  return string.find(' ' .. attempts .. ' ', ' ' .. attempt .. ' ', 1, true) ~= nil
end

-- `attempts` without the hold of `attempt` ("": the newest hold); nil when it has no such hold.
local function without(attempts, attempt)
  local words = {}
  for word in string.gmatch(attempts, '%S+') do words[#words + 1] = word end
  local at = nil
  if attempt == '' then
    at = #words
  else
    for i = #words, 1, -1 do
      if words[i] == attempt then at = i break end
    end
  end
  if not at or at == 0 then return nil end
  table.remove(words, at)
  return table.concat(words, ' ')
end

-- The next fencing token of a lock, as a decimal string: above every token the counter has seen,
-- and at least the server's clock in microseconds. The clock is what keeps tokens increasing
-- when a failover loses the counter's last writes (a replica promoted without them): the next
-- token still exceeds every token issued before, provided the new primary's clock is not behind
-- the old one's by more than the failover took. The counter alone covers many tokens in one
-- microsecond and a clock that stepped back. It expires a day after its last use.
local FENCE_TTL_MS = 86400000
local function next_token(fence_key)
  local t = redis.call('TIME')
  local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', fence_key))
  if last and last >= token then token = last + 1 end
  token = string.format('%d', token)
  redis.call('SET', fence_key, token, 'PX', FENCE_TTL_MS)
  return token
end

-- The queue of a lock (or semaphore): a list of waiter ids, oldest first, and a hash of waiter id
-- -> "expiry_ms\nowner\nlease_ms\nmeta_json". A waiter is an acquisition attempt: its id is the
-- attempt id, and its process listens on <prefix><process token>.
local function parse_details(details)
  return string.match(details, '^(%d+)\n([^\n]*)\n(%d+)\n(.*)$')
end

-- How a script tells waiters' processes, from two arguments the caller decides (never this
-- script): the channel prefix and `sharded`. "0": PUBLISH on <ns>:wake:<process token> (a
-- single Redis, Sentinel; on a Cluster it reaches every node). "1": SPUBLISH on the shard
-- channel <ns>:wake:{<tag>}:<process token>, in the slot of the lock's keys, so only the lock's
-- shard hears it (a Cluster with sharded Pub/Sub).
local function wake_to(prefix, sharded)
  if sharded == '1' then return {prefix, 'SPUBLISH'} end
  return {prefix, 'PUBLISH'}
end

-- Send `message` to the process of `waiter`; returns how many subscribers heard it.
local function publish_to(wake, waiter, message)
  return redis.call(wake[2], wake[1] .. string.match(waiter, '^([^.]*)'), message)
end

-- Queue a waiter, or refresh its entry in place (idempotent: a repeat keeps its position). Both
-- keys live as long as their longest-lived entry.
local function enqueue(queue_key, waiters_key, waiter, owner, lease_ms, meta, entry_ms, now)
  local details = string.format('%d\n%s\n%d\n%s', now + entry_ms, owner, lease_ms, meta)
  if redis.call('HSET', waiters_key, waiter, details) == 1 then
    redis.call('RPUSH', queue_key, waiter)
  end
  if redis.call('PTTL', queue_key) < entry_ms then
    redis.call('PEXPIRE', queue_key, entry_ms)
    redis.call('PEXPIRE', waiters_key, entry_ms)
  end
end

local function dequeue(queue_key, waiters_key, waiter)
  if redis.call('HDEL', waiters_key, waiter) == 1 then redis.call('LREM', queue_key, 1, waiter) end
end

-- A waiter re-checks on its own no later than its entry's expiry minus this margin (the client
-- makes entries expire this long after its planned re-check: see flow.ENTRY_MARGIN).
local ENTRY_MARGIN_MS = 2000

-- Tell the next waiter in line to re-check when the new holder's lease (or claim window) ends,
-- if it would otherwise re-check later than that.
local function tell_next(queue_key, waiters_key, wake, lease_ms, now)
  local nxt = redis.call('LINDEX', queue_key, 0)
  if not nxt then return end
  local details = redis.call('HGET', waiters_key, nxt)
  local expiry = details and parse_details(details)
  if expiry and now + lease_ms < tonumber(expiry) - ENTRY_MARGIN_MS then
    publish_to(wake, nxt, string.format('r %s %d', nxt, lease_ms))
  end
end

-- Pop waiters until one is live and give it the next fencing token: returns its id, owner,
-- lease, metadata and token, or nil when nobody live waits. A waiter of the process running
-- this script (`here`, its process token) is not published to: the caller wakes it (6th value
-- true). Any other waiter's process is told on its channel: "h <waiter> <token>" when `trust`
-- is "1" (PUBLISH counts every subscriber: the waiter holds the lock from now on, and a waiter
-- whose process no longer listens is skipped), "h <waiter>" otherwise (it must claim).
local function next_waiter(queue_key, waiters_key, fence_key, wake, trust, now, here)
  local waiter = redis.call('LPOP', queue_key)
  while waiter do
    local details = redis.call('HGET', waiters_key, waiter)
    redis.call('HDEL', waiters_key, waiter)
    local x, o, l, m = nil, nil, nil, nil
    if details then x, o, l, m = parse_details(details) end
    if x and tonumber(x) > now then
      local token = next_token(fence_key)
      if here and string.match(waiter, '^([^.]*)') == here then
        return waiter, o, tonumber(l), m, token, true
      end
      local message = 'h ' .. waiter
      if trust == '1' then message = message .. ' ' .. token end
      local heard = publish_to(wake, waiter, message)
      if heard > 0 or trust ~= '1' then return waiter, o, tonumber(l), m, token end
    end
    waiter = redis.call('LPOP', queue_key)
  end
  return nil
end

-- With claim_ms "0" (independent masters, Redlock) nothing is handed over: a lock held on a
-- majority cannot be handed on by one master, so every live waiter is told to try again now.
local function wake_all(queue_key, waiters_key, wake, now)
  local waiters = redis.call('LRANGE', queue_key, 0, -1)
  for _, waiter in ipairs(waiters) do
    local details = redis.call('HGET', waiters_key, waiter)
    local x = details and parse_details(details)
    if x and tonumber(x) > now then
      publish_to(wake, waiter, 'r ' .. waiter .. ' 0')
    end
  end
  redis.call('DEL', queue_key, waiters_key)
end

-- Give the lock to the oldest live waiter, or delete it when nobody waits.
--
-- Where PUBLISH counts every subscriber (`trust` "1": a single Redis without REPLICAS), the waiter
-- is handed the lock outright: full lease, and its token in the wake-up message. Elsewhere (a
-- Cluster, where PUBLISH counts one node's subscribers, or REPLICAS, where the waiter's own call
-- must be acknowledged) the lock is only reserved for the waiter for a short claim window
-- (claim_ms) and the woken waiter claims it with acquire.lua, which sets the full lease. Either
-- way the record names the waiter as the hold's attempt, so a waiter that missed its message
-- finds the lock its own when it re-checks.
-- Returns the new holder's token, or false when the lock was deleted; and, when the new holder
-- is a waiter of the calling process (`here`), its id: the caller must wake it.
local function hand_off(lock_key, fence_key, queue_key, waiters_key, wake, trust, claim_ms, here)
  local now = server_ms()
  if tonumber(claim_ms) == 0 then
    wake_all(queue_key, waiters_key, wake, now)
    redis.call('DEL', lock_key)
    return false
  end
  local w, o, l, m, token, mine =
    next_waiter(queue_key, waiters_key, fence_key, wake, trust, now, here)
  if not w then
    redis.call('DEL', lock_key)
    return false
  end
  local lease = trust == '1' and l or tonumber(claim_ms)
  local reserved = nil
  if trust ~= '1' then reserved = w end
  redis.call('SET', lock_key, record(o, w, token, now, reserved, m), 'PX', lease)
  tell_next(queue_key, waiters_key, wake, lease, now)
  if mine then return token, w end
  return token
end

-- Drop the hold of `attempt` ("": the newest; all_holds: every hold) from `rec`, a record of
-- `owner`; the last hold hands the lock on. Returns what release.lua returns: -1 when there is
-- no such hold, else the holds left, or {0, waiter, token} when a waiter of the calling process
-- (`here`) was handed the lock (token -1: reserved only, the waiter claims it).
local function drop_hold(keys, owner, rec, attempt, all_holds, wake, trust, claim_ms, here)
  local left = ''
  if not all_holds then
    left = without(rec.a, attempt)
    if not left then return -1 end
  end
  if left ~= '' then
    local w = rec.w
    if w and not has_attempt(left, w) then w = nil end
    redis.call('SET', keys[1], record(owner, left, rec.t, rec.at, w, rec.m), 'KEEPTTL')
    return rec.n - 1
  end
  if redis.call('LLEN', keys[3]) == 0 then
    redis.call('DEL', keys[1])
    return 0
  end
  local token, mine = hand_off(keys[1], keys[2], keys[3], keys[4], wake, trust, claim_ms, here)
  if mine then
    if trust == '1' then return {0, mine, tonumber(token)} end
    return {0, mine, -1}
  end
  return 0
end

-- Per-field expiry (HPEXPIREAT: Redis 7.4+, Valkey 9): the transport appends "ttl:1" as the last
-- argument of every script that uses this where the server has it ("ttl:0" elsewhere). A holder's
-- record fields then end with its lease, so the server reclaims a crashed holder's record even
-- if no script touches the name again; the scripts still count holders by their scores (the
-- server's clock), never by which fields exist. HSET on a field clears its expiry: called after
-- every write of a record and every change of its lease.
local function expire_fields(key, at_ms, ...)
  if ARGV[#ARGV] == 'ttl:1' then
    redis.call('HPEXPIREAT', key, at_ms, 'FIELDS', select('#', ...), ...)
  end
end

-- Semaphores: <ns>:sem:{name} is a sorted set of fencing tokens scored by their expiry (server
-- ms): a lease per permit, so a crashed holder frees its permit when its lease ends.
-- <ns>:semrec:{name} is a hash: token -> the permit's record (as for locks, one attempt),
-- "permits" -> the limit last used, "a:<attempt>" -> the token of that attempt's permit.

local function attempt_of(rec)
  return string.match(rec, ',"a":"([^"]*)"')
end

-- Forget one permit (its lease, record and attempt index).
local function sem_forget(sem_key, rec_key, token)
  local rec = redis.call('HGET', rec_key, token)
  if rec then
    local a = attempt_of(rec)
    if a then redis.call('HDEL', rec_key, 'a:' .. a) end
    redis.call('HDEL', rec_key, token)
  end
  redis.call('ZREM', sem_key, token)
end

-- Drop permits whose lease ended.
local function sem_purge(sem_key, rec_key, now)
  local dead = redis.call('ZRANGEBYSCORE', sem_key, '-inf', now)
  for _, token in ipairs(dead) do sem_forget(sem_key, rec_key, token) end
end

-- Both keys live exactly as long as their longest permit.
local function sem_touch(sem_key, rec_key)
  local last = redis.call('ZRANGE', sem_key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', sem_key, last[2])
    redis.call('PEXPIREAT', rec_key, last[2])
  else
    redis.call('DEL', sem_key, rec_key)
  end
end

-- Take a permit for `owner` and its `attempt` (reserved for the attempt when `reserved`).
local function sem_take(sem_key, rec_key, owner, attempt, lease_ms, meta, reserved, now, token)
  redis.call('ZADD', sem_key, now + lease_ms, token)
  local waiter = nil
  if reserved then waiter = attempt end
  redis.call('HSET', rec_key, token, record(owner, attempt, token, now, waiter, meta),
    'a:' .. attempt, token)
  expire_fields(rec_key, now + lease_ms, token, 'a:' .. attempt)
  return token
end

-- The live permit of `attempt` (token and record), or nil.
local function sem_permit_of(sem_key, rec_key, attempt)
  local token = redis.call('HGET', rec_key, 'a:' .. attempt)
  if not token or not redis.call('ZSCORE', sem_key, token) then return nil end
  return token, redis.call('HGET', rec_key, token)
end

-- The permit of `attempt` becomes held with the full lease from now (a claim, or a repeat).
local function sem_confirm(sem_key, rec_key, owner, attempt, lease_ms, meta, now, token, rec)
  local rest = parse(rec, owner)
  if not rest then return nil end
  local ends = math.max(tonumber(redis.call('ZSCORE', sem_key, token)), now + lease_ms)
  redis.call('ZADD', sem_key, ends, token)
  redis.call('HSET', rec_key, token, record(owner, attempt, token, rest.at, nil, meta))
  expire_fields(rec_key, ends, token, 'a:' .. attempt)
  return token
end

-- Give free permits to the oldest live waiters (the semaphore's hand_off).
local function sem_hand_off(sem_key, rec_key, fence_key, queue_key, waiters_key, wake, trust,
    claim_ms, now)
  local permits = tonumber(redis.call('HGET', rec_key, 'permits')) or 1
  local handed = 0
  while redis.call('ZCARD', sem_key) < permits and redis.call('LLEN', queue_key) > 0 do
    local w, o, l, m, token =
      next_waiter(queue_key, waiters_key, fence_key, wake, trust, now)
    if not w then break end
    local lease = trust == '1' and l or tonumber(claim_ms)
    sem_take(sem_key, rec_key, o, w, lease, m, trust ~= '1', now, token)
    handed = handed + 1
  end
  if handed > 0 then
    local first = redis.call('ZRANGE', sem_key, 0, 0, 'WITHSCORES')
    tell_next(queue_key, waiters_key, wake, math.max(1, tonumber(first[2]) - now), now)
  end
  sem_touch(sem_key, rec_key)
  return handed
end

-- Read-write locks. keys: {write, readers, records, fence, queue, waiters}.
-- <ns>:rw:{name} is the writer's record (as a lock's, PX = lease); <ns>:rwr:{name} a sorted set
-- owner -> the end of that reader's lease (server ms), one member per reading owner;
-- <ns>:rwrec:{name} a hash owner -> that reader's record (as a lock's). The queue is a lock's
-- (<ns>:rwq:{name} list of waiter ids, <ns>:rwwait:{name} their details) plus a field
-- "w:<waiter>" for each waiter that wants to write.

-- Drop readers whose lease ended.
local function rw_purge(keys, now)
  local dead = redis.call('ZRANGEBYSCORE', keys[2], '-inf', now)
  for _, o in ipairs(dead) do redis.call('HDEL', keys[3], o) end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', now) end
end

-- The readers' keys live exactly as long as their longest lease (as a semaphore's permits).
local function rw_touch(keys)
  sem_touch(keys[2], keys[3])
end

local function rw_dequeue(keys, waiter)
  redis.call('HDEL', keys[6], 'w:' .. waiter)
  if redis.call('HDEL', keys[6], waiter) == 1 then
    redis.call('LREM', keys[5], 1, waiter)
    return true
  end
  return false
end

-- Whether a live waiter queued ahead of `attempt` goes first: any waiter when `attempt` writes
-- (writers are served in order), a writer when it reads (a waiting writer blocks new readers).
-- Entries that expired are dropped on the way.
local function rw_blocked(keys, attempt, writes, now)
  for _, id in ipairs(redis.call('LRANGE', keys[5], 0, -1)) do
    if id == attempt then return false end
    local details = redis.call('HGET', keys[6], id)
    local x = details and parse_details(details)
    if not x or tonumber(x) <= now then
      rw_dequeue(keys, id)
    elseif writes or redis.call('HEXISTS', keys[6], 'w:' .. id) == 1 then
      return true
    end
  end
  return false
end

-- After a release: the waiters that may go now re-check at once (their acquire takes it in
-- queue order): the oldest live waiter when it writes and nobody holds anything, else the
-- readers at the head of the queue up to the first writer.
local function rw_wake(keys, wake, now)
  if redis.call('EXISTS', keys[1]) == 1 then return end
  local readers = redis.call('ZCARD', keys[2])
  for _, id in ipairs(redis.call('LRANGE', keys[5], 0, -1)) do
    local details = redis.call('HGET', keys[6], id)
    local x = details and parse_details(details)
    if x and tonumber(x) > now then
      if redis.call('HEXISTS', keys[6], 'w:' .. id) == 1 then
        if readers == 0 then publish_to(wake, id, 'r ' .. id .. ' 0') end
        return
      end
      publish_to(wake, id, 'r ' .. id .. ' 0')
      readers = readers + 1
    end
  end
end

-- The hold record of `owner` in mode `writes` (raw value, or nil).
local function rw_raw(keys, owner, writes)
  if writes then return redis.call('GET', keys[1]) end
  return redis.call('HGET', keys[3], owner)
end

-- Drop the hold of `attempt` ("": the newest; all_holds: every hold) of `owner` in one mode;
-- the last one lets the waiters that may go now re-check. -1: no such hold, else holds left.
local function rw_drop(keys, owner, writes, attempt, all_holds, wake, now)
  local rec = parse(rw_raw(keys, owner, writes), owner)
  if not rec then return -1 end
  local left = ''
  if not all_holds then
    left = without(rec.a, attempt)
    if not left then return -1 end
  end
  if left ~= '' then
    local value = record(owner, left, rec.t, rec.at, nil, rec.m)
    if writes then
      redis.call('SET', keys[1], value, 'KEEPTTL')
    else
      redis.call('HSET', keys[3], owner, value)
      local ends = redis.call('ZSCORE', keys[2], owner)
      if ends then expire_fields(keys[3], ends, owner) end
    end
    return rec.n - 1
  end
  if writes then
    redis.call('DEL', keys[1])
  else
    redis.call('HDEL', keys[3], owner)
    redis.call('ZREM', keys[2], owner)
    rw_touch(keys)
  end
  rw_wake(keys, wake, now)
  return 0
end
