-- rw_renew.lua: reset (or extend) the lease of this owner's hold in one mode of a read-write
-- lock.
--
-- KEYS[1] <ns>:rw:{name}; KEYS[2] <ns>:rwr:{name}; KEYS[3] <ns>:rwrec:{name}
-- ARGV[1] owner id; ARGV[2] milliseconds; ARGV[3] "set" or "add"; ARGV[4] "w" or "r"
--
-- Returns 1 when renewed, 0 when the owner no longer holds it (expired or force-released).

local owner, ms = ARGV[1], tonumber(ARGV[2])
if ARGV[4] == 'w' then
  if not owned_by(redis.call('GET', KEYS[1]), owner) then return 0 end
  if ARGV[3] == 'add' then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then ms = ms + left end
  end
  redis.call('PEXPIRE', KEYS[1], ms)
  return 1
end
local now = server_ms()
local ends = tonumber(redis.call('ZSCORE', KEYS[2], owner))
if not ends or ends <= now or not owned_by(redis.call('HGET', KEYS[3], owner), owner) then
  return 0
end
if ARGV[3] == 'add' then ms = ms + (ends - now) end
redis.call('ZADD', KEYS[2], now + ms, owner)
expire_fields(KEYS[3], now + ms, owner)
rw_touch(KEYS)
return 1
