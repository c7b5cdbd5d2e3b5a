-- force_release.lua: an operator deletes a lock whoever holds it; waiters get it next.
--
-- KEYS[1] <ns>:lock:{name}
-- KEYS[2] <ns>:fence:{name}
-- KEYS[3] <ns>:queue:{name}
-- ARGV[1] expected fencing token, "" to release whatever holds the lock
-- ARGV[2] wake-key prefix "<ns>:wake:{name}:"
--
-- Returns {1, released_token} when the lock was released, {0, current_token_or_0} otherwise
-- (not held, or held under another token: a lock that changed hands is never touched).

local raw = redis.call('GET', KEYS[1])
if not raw then return {0, 0} end
local token = cjson.decode(raw).t
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= token then return {0, token} end
hand_off(KEYS[1], KEYS[2], KEYS[3], ARGV[2])
return {1, token}
