-- renew_many.lua: reset the leases of many locks in one call (the watchdog, on one Redis).
--
-- KEYS[i]       <ns>:lock:{name_i}
-- ARGV[1]       milliseconds: the new lease of every key (the caller batches by lease)
-- ARGV[i + 1]   owner id of KEYS[i]
--
-- Returns one integer per key, in order: 1 renewed, 0 no longer held by that owner (expired or
-- force-released). Not for a Cluster: its keys would be in several slots.

local ms = ARGV[1]
local out = {}
for i, key in ipairs(KEYS) do
  if owned_by(redis.call('GET', key), ARGV[i + 1]) then
    redis.call('PEXPIRE', key, ms)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
