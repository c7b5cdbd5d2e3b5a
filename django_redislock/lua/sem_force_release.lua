-- sem_force_release.lua: an operator frees one permit (by token) or every permit of a semaphore.
--
-- KEYS[1] <ns>:sem:{name}; KEYS[2] <ns>:semrec:{name}; KEYS[3] <ns>:fence[:{name}];
-- KEYS[4] <ns>:semq:{name}; KEYS[5] <ns>:semw:{name}
-- ARGV[1] the permit's fencing token, "" for every permit
-- ARGV[2] wake channel prefix; ARGV[3] "1": SPUBLISH on the shard channel, "0": PUBLISH
-- ARGV[4] outright hand-off "1"/"0"; ARGV[5] claim window, ms
--
-- Returns {n, token_1, record_1, ..., token_n, record_n}: the permits released (n = 0: none).

local now = server_ms()
sem_purge(KEYS[1], KEYS[2], now)
local tokens
if ARGV[1] == '' then
  tokens = redis.call('ZRANGE', KEYS[1], 0, -1)
elseif redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  tokens = {ARGV[1]}
else
  tokens = {}
end
local out = {0}
for _, token in ipairs(tokens) do
  local rec = redis.call('HGET', KEYS[2], token) or ''
  sem_forget(KEYS[1], KEYS[2], token)
  out[1] = out[1] + 1
  out[#out + 1] = token
  out[#out + 1] = rec
end
sem_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], wake_to(ARGV[2], ARGV[3]), ARGV[4],
  ARGV[5], now)
return out
