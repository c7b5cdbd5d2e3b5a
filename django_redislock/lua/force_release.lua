-- force_release.lua: an operator deletes a lock whoever holds it; waiters get it next.
--
-- KEYS[1] <ns>:lock:{name}
-- KEYS[2] <ns>:fence[:{name}]
-- KEYS[3] <ns>:queue:{name}
-- KEYS[4] <ns>:waiters:{name}
-- ARGV[1] expected fencing token, "" to release whatever holds the lock ("0" matches a value
--         that is not a readable record)
-- ARGV[2] wake channel prefix; ARGV[3] "1": SPUBLISH on the lock's shard channel, "0": PUBLISH
-- ARGV[4] outright hand-off "1"/"0"; ARGV[5] claim window, ms
--
-- Returns {1, released_token, raw} when the lock was released, {0, current_token, raw} when it
-- is held under another token (a lock that changed hands is never touched), {0, 0} when not held.
-- raw is the stored value (the record released, or the one left in place), so callers report
-- exactly what this call saw. A value that is not a lock record (written by something else, or
-- corrupted) counts as token 0: it can be released, with or without expected token "0".

local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' and raw.err then
  -- Not a string at all (WRONGTYPE): something else wrote this key; release it as unreadable.
  raw = '<' .. redis.call('TYPE', KEYS[1]).ok .. ': not a string value>'
end
if not raw then return {0, 0} end
local token = 0
local ok, rec = pcall(cjson.decode, raw)
if ok and type(rec) == 'table' and rec.o ~= nil and rec.n ~= nil and rec.at ~= nil then
  token = tonumber(string.match(raw, '"t":(%d+)')) or 0
end
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= token then return {0, token, raw} end
hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], wake_to(ARGV[2], ARGV[3]), ARGV[4], ARGV[5])
return {1, token, raw}
