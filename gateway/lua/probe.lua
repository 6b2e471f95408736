-- probe: may a request call this deployment now? Closed: yes. Open: no, until its open time is
-- over; then the breaker turns half-open and grants at most `probes` permits, atomically, however
-- many processes ask at once. Permits granted long ago that never reported back are renewed.
--
-- KEYS: breaker hash. ARGV: probes, probe timeout ms.
-- Returns {allowed 0|1, probe 0|1, transition ('' | 'open>half_open')}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
local state, open_until = breaker_state(key, now)
if state == 'forced_open' then return {0, 0, ''} end
if state == 'forced_closed' or state == 'closed' then return {1, 0, ''} end
local transition = ''
if state == 'open' then
  if now < open_until then return {0, 0, ''} end
  redis.call('HSET', key, 'state', 'half_open', 'probes', 0, 'probe_ok', 0, 'half_open_since', now)
  transition = 'open>half_open'
end
local since = tonumber(redis.call('HGET', key, 'half_open_since') or '0')
if now - since > tonumber(ARGV[2]) then
  redis.call('HSET', key, 'probes', 0, 'probe_ok', 0, 'half_open_since', now)
end
if redis.call('HINCRBY', key, 'probes', 1) > tonumber(ARGV[1]) then
  redis.call('HINCRBY', key, 'probes', -1)
  return {0, 0, transition}
end
return {1, 1, transition}
