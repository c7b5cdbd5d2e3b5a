-- rate_reset.lua: forget a rate limiter's history (its next decision finds it rested).
--
-- KEYS[1] <ns>:rate:{name}
--
-- Returns 1 when there was a history to forget, else 0. Safe to repeat.

return redis.call('DEL', KEYS[1])
