-- cancel.lua: a waiter gives up (deadline reached or interrupted).
--
-- KEYS[1] <ns>:queue:{name}
-- KEYS[2] <ns>:wake:{name}:<waiter>
-- ARGV[1] the waiter's current queue entry
--
-- Returns the fencing token when a release handed the lock to this waiter before it gave up (the
-- caller now holds the lock), else 0 (the entry is removed from the queue).

local handed = redis.call('LPOP', KEYS[2])
if handed then return tonumber(handed) end
redis.call('LREM', KEYS[1], 1, ARGV[1])
return 0
