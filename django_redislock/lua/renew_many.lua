-- renew_many.lua: reset the leases of many locks in one call (the watchdog, on one Redis).
--
-- KEYS[i]       <ns>:lock:{name_i}
-- ARGV[2i - 1]  owner id of KEYS[i]
-- ARGV[2i]      milliseconds: the new lease of KEYS[i]
--
-- Returns one integer per key, in order: 1 renewed, 0 no longer held by that owner (expired or
-- force-released). Not for a Cluster: its keys would be in several slots.

local out = {}
for i, key in ipairs(KEYS) do
  if owner_end(redis.call('GET', key), ARGV[2 * i - 1]) then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
