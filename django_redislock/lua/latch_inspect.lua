-- latch_inspect.lua: the remaining count of a latch, writing nothing.
--
-- KEYS[1] <ns>:latch:{name}   hash: "n" initial count, "c" remaining count
--
-- Returns the remaining count, or -1 when the latch has no state (never used, or expired).

local c = redis.call('HGET', KEYS[1], 'c')
if not c then return -1 end
return tonumber(c)
