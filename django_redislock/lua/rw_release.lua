-- rw_release.lua: drop a hold of this owner in one mode of a read-write lock; the last hold
-- lets the waiters that may go now re-check (see rw_wake).
--
-- KEYS[1..6] as rw_acquire.lua: writer, readers, readers' records, fence, queue, waiters
-- ARGV[1] owner id; ARGV[2] attempt id of the hold ("": the newest)
-- ARGV[3] "1": drop every hold of the owner in this mode; ARGV[4] wake channel prefix
-- ARGV[5] "1": SPUBLISH on the shard channel, "0": PUBLISH; ARGV[6] "w" or "r"
--
-- Returns the owner's holds left in this mode, or -1 when it held none.

local now = server_ms()
rw_purge(KEYS, now)
local wake = wake_to(ARGV[4], ARGV[5])
return rw_drop(KEYS, ARGV[1], ARGV[6] == 'w', ARGV[2], ARGV[3] == '1', wake, now)
