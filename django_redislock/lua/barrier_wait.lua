-- barrier_wait.lua: every change of a barrier: a party arrives, re-checks (renewing its lease),
-- gives up at its deadline; abort and reset. Idempotent per waiter id (a resend after a lost
-- reply finds the party's record and adds no arrival).
--
-- KEYS[1] <ns>:barrier:{name}   hash: "p" parties, "b" "0", or why the barrier is broken
-- KEYS[2] <ns>:barrierw:{name}  the parties of the current round: waiter id -> lease end (ms)
-- KEYS[3] <ns>:barrierx:{name}  waiter id -> "<state> <index>[ <why>]": the state is w (waiting),
--                               t (the round passed) or b (broken); the waiter reads and deletes
--                               its record once it is t or b
-- ARGV[1] "arrive", "check" (an arrived party re-checks), "timeout", "abort" or "reset"
-- ARGV[2] waiter id: "<process token>.<n>", its process listens on <prefix><process token>
--         ("" for abort and reset by no party)
-- ARGV[3] parties (reset adopts it; an arrival with another number is refused)
-- ARGV[4] the party's lease, ms
-- ARGV[5] expiry of every key after this call, ms
-- ARGV[6] wake channel prefix; ARGV[7] "1": SPUBLISH on the shard channel, "0": PUBLISH
--
-- Returns {state, index, ms, why}: state 0 waiting (ms: until the soonest lease of another
-- party ends, -1 when none), 1 the round passed, 2 broken (why: lease, timeout, abort, reset,
-- lost), 3 refused: the barrier has another number of parties (index: that number).

local op, waiter, parties = ARGV[1], ARGV[2], tonumber(ARGV[3])
local lease, wake = tonumber(ARGV[4]), wake_to(ARGV[6], ARGV[7])
local now = server_ms()

local function touch(result)
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
  return result
end

local function index_of(member)
  local rec = redis.call('HGET', KEYS[3], member)
  return rec and string.match(rec, '^%a (%d+)') or '-1'
end

-- End the round: every arrived party's record becomes `state`, and each is woken (the caller
-- learns it from the reply).
local function finish(state, why)
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    redis.call('HSET', KEYS[3], member, state .. ' ' .. index_of(member) .. why)
    if member ~= waiter then
      publish_to(wake, member, 'r ' .. member .. ' 0')
    end
  end
  redis.call('DEL', KEYS[2])
end

local function break_round(why)
  finish('b', ' ' .. why)
  redis.call('HSET', KEYS[1], 'b', why)
end

-- A party whose lease ended (its process died, stopped or lost Redis) breaks the round.
local function a_party_died()
  if redis.call('ZCOUNT', KEYS[2], '-inf', now) == 0 then return false end
  break_round('lease')
  return true
end

local function soonest_other()
  local first = redis.call('ZRANGE', KEYS[2], 0, 1, 'WITHSCORES')
  for i = 1, #first, 2 do
    if first[i] ~= waiter then return math.max(0, tonumber(first[i + 1]) - now) end
  end
  return -1
end

if redis.call('HSETNX', KEYS[1], 'p', parties) == 1 then redis.call('HSET', KEYS[1], 'b', '0') end

-- The caller's record: a round that ended for it is reported once.
local rec = waiter ~= '' and redis.call('HGET', KEYS[3], waiter)
local index = -1
if rec then
  local state, at, why = string.match(rec, '^(%a) (%-?%d+) ?(%a*)$')
  index = tonumber(at)
  if state ~= 'w' then
    redis.call('HDEL', KEYS[3], waiter)
    if state == 't' then return touch({1, index, -1, ''}) end
    return touch({2, index, -1, why})
  end
end

if op == 'reset' then
  finish('b', ' reset')
  redis.call('HSET', KEYS[1], 'p', parties, 'b', '0')
  return touch({2, index, -1, 'reset'})
end
if op == 'abort' or op == 'timeout' then
  break_round(op)
  if rec then redis.call('HDEL', KEYS[3], waiter) end
  return touch({2, index, -1, op})
end

if rec then
  -- Waiting: renew the party's lease, unless the round is over for it.
  if not redis.call('ZSCORE', KEYS[2], waiter) then
    redis.call('HDEL', KEYS[3], waiter)
    return touch({2, index, -1, 'lost'})
  end
  if a_party_died() then
    redis.call('HDEL', KEYS[3], waiter)
    return touch({2, index, -1, 'lease'})
  end
  redis.call('ZADD', KEYS[2], now + lease, waiter)
  return touch({0, index, soonest_other(), ''})
end
if op == 'check' then
  -- It arrived, but its record is gone: the keys expired or were deleted meanwhile.
  return touch({2, -1, -1, 'lost'})
end

-- A new arrival.
local p = tonumber(redis.call('HGET', KEYS[1], 'p'))
if p ~= parties then return touch({3, p, -1, ''}) end
local broken = redis.call('HGET', KEYS[1], 'b')
if broken and broken ~= '0' then return touch({2, -1, -1, broken}) end
if a_party_died() then return touch({2, -1, -1, 'lease'}) end
index = redis.call('ZCARD', KEYS[2])
if index + 1 >= p then
  finish('t', '')
  return touch({1, index, -1, ''})
end
redis.call('ZADD', KEYS[2], now + lease, waiter)
redis.call('HSET', KEYS[3], waiter, 'w ' .. index)
return touch({0, index, soonest_other(), ''})
