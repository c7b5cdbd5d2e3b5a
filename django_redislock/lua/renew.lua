-- renew.lua: reset the lease of a lock this owner holds.
--
-- KEYS[1] <ns>:lock:{name}
-- ARGV[1] owner id
-- ARGV[2] lease, ms
--
-- Returns 1 when renewed, 0 when the owner no longer holds the lock (expired or force-released).

if owned_by(redis.call('GET', KEYS[1]), ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
