-- pace: a tenant's batch requests spaced evenly, however many workers run them. Each call takes the
-- next free moment in the tenant's schedule (one every `interval` ms, never in the past) and returns
-- how long the caller waits for it: virtual scheduling, as GCRA does it, without bursts.
--
-- KEYS: the tenant's next free moment. ARGV: interval ms.
-- Returns the wait in ms.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local at = math.max(now, tonumber(redis.call('GET', KEYS[1]) or '0'))
redis.call('SET', KEYS[1], string.format('%d', at + interval), 'PX', string.format('%d', at + interval - now + 1000))
return at - now
