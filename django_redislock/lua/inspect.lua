-- inspect.lua: whether a lock is held, and whether by this owner (read-only).
--
-- KEYS[1] <ns>:lock:{name}
-- ARGV[1] owner id
--
-- Returns {held, owned, readable, raw}: held 1 when the key exists; owned 1 when it is a record
-- of this owner; readable 0 when the value is not a lock record (written by something else, or
-- corrupted: raw is then the first 80 bytes of it).

local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' and raw.err then
  return {1, 0, 0, '<' .. redis.call('TYPE', KEYS[1]).ok .. ': not a string value>'}
end
if not raw then return {0, 0, 1, ''} end
local ok, rec = pcall(cjson.decode, raw)
if not (ok and type(rec) == 'table' and rec.o ~= nil and rec.n ~= nil and rec.at ~= nil) then
  return {1, 0, 0, string.sub(raw, 1, 80)}
end
if owned_by(raw, ARGV[1]) then return {1, 1, 1, ''} end
return {1, 0, 1, ''}
