-- force_release.lua: an operator deletes a lock whoever holds it; waiters get it next.
--
-- KEYS[1] <ns>:lock:{name}
-- KEYS[2] <ns>:fence:{name}
-- KEYS[3] <ns>:queue:{name}
-- ARGV[1] expected fencing token, "" to release whatever holds the lock ("0" matches a value
--         that is not a readable record)
-- ARGV[2] wake channel prefix; ARGV[3] trust PUBLISH counts; ARGV[4] claim window, ms
--
-- Returns {1, released_token, released_value} when the lock was released, {0, current_token}
-- otherwise (not held: token 0, or held under another token: a lock that changed hands is never
-- touched).

local raw = redis.call('GET', KEYS[1])
if not raw then return {0, 0} end
local token = 0
local ok, rec = pcall(cjson.decode, raw)
if ok and type(rec) == 'table' and tonumber(rec.t) then token = tonumber(rec.t) end
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= token then return {0, token} end
hand_off(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3], ARGV[4])
return {1, token, raw}
