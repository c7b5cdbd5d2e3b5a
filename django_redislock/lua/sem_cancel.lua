-- sem_cancel.lua: a semaphore waiter stops waiting (deadline reached, or interrupted).
--
-- KEYS[1] <ns>:sem:{name}; KEYS[2] <ns>:semrec:{name}; KEYS[3] <ns>:fence:{name};
-- KEYS[4] <ns>:semq:{name}
-- ARGV[1] the waiter's current queue entry ("" when it has none)
-- ARGV[2] waiter id
-- ARGV[3] owner id
-- ARGV[4] lease, ms
-- ARGV[5] "1": a permit reserved for this waiter is claimed; "0": it is passed on
-- ARGV[6] wake channel prefix; ARGV[7] trust PUBLISH counts; ARGV[8] claim window, ms
-- ARGV[9] holder metadata (for a claim)
--
-- Returns {1, token, 1} when a reserved permit was claimed, else {0}.

local now = server_ms()
if ARGV[5] == '1' then
  local token = sem_claim(KEYS[1], KEYS[2], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[9], now)
  if token then
    sem_touch(KEYS[1], KEYS[2])
    return {1, token, 1}
  end
else
  local token = redis.call('HGET', KEYS[2], 'w:' .. ARGV[2])
  if token then
    redis.call('HDEL', KEYS[2], 'w:' .. ARGV[2], token)
    redis.call('ZREM', KEYS[1], token)
    sem_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[6], ARGV[7], ARGV[8], now)
    return {0}
  end
end
if ARGV[1] ~= '' then redis.call('LREM', KEYS[4], 1, ARGV[1]) end
return {0}
