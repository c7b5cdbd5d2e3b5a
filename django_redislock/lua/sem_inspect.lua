-- sem_inspect.lua: how many permits are held, and how many of them by one owner.
--
-- KEYS[1] <ns>:sem:{name}; KEYS[2] <ns>:semrec:{name}
-- ARGV[1] owner id
--
-- Returns {live permits, permits of the owner}. Read-only: expired permits are not counted.

local now = server_ms()
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
local mine = 0
for _, token in ipairs(live) do
  if owned_by(redis.call('HGET', KEYS[2], token), ARGV[1]) then mine = mine + 1 end
end
return {#live, mine}
