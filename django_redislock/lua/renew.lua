-- renew.lua: reset (or extend) the lease of a lock this owner holds.
--
-- KEYS[1] <ns>:lock:{name}
-- ARGV[1] owner id
-- ARGV[2] milliseconds
-- ARGV[3] "set": the lease becomes ARGV[2]; "add": ARGV[2] is added to the remaining lease
--
-- Returns 1 when renewed, 0 when the owner no longer holds the lock (expired or force-released).

local raw = redis.call('GET', KEYS[1])
if not owned_by(raw, ARGV[1]) then return 0 end
local ms = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then ms = ms + left end
end
redis.call('PEXPIRE', KEYS[1], ms)
return 1
