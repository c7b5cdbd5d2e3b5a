-- rw_inspect.lua: whether one mode of a read-write lock is held, and whether by this owner
-- (read-only).
--
-- KEYS[1] <ns>:rw:{name}; KEYS[2] <ns>:rwr:{name}
-- ARGV[1] owner id; ARGV[2] "w" or "r"
--
-- Returns {held, owned}: the writer's record exists / a reader's lease has not ended.

if ARGV[2] == 'w' then
  local raw = redis.call('GET', KEYS[1])
  if not raw then return {0, 0} end
  if owned_by(raw, ARGV[1]) then return {1, 1} end
  return {1, 0}
end
local now = server_ms()
local held = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local ends = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]))
local owned = 0
if ends and ends > now then owned = 1 end
return {held, owned}
