-- Circuit breakers, one per deployment, shared by every gateway process. Prepended to the scripts
-- that use it (admission reads states, settle records outcomes, probe grants half-open permits).
--
-- A breaker is a hash: state (closed | open | half_open), forced ('' | open | closed), open_until (ms),
-- openings (consecutive, so the open time grows), probes (granted while half-open), probe_ok,
-- half_open_since (ms). Its sliding window is a second hash of per-second buckets: <s>:c calls,
-- <s>:f failures, <s>:s slow calls.
--
-- Policy (7 numbers): window s, minimum calls, failure %, slow %, open ms, max open ms, probes.

local function breaker_state(key, now)
  local b = redis.call('HMGET', key, 'state', 'forced', 'open_until')
  local forced = b[2] or ''
  if forced ~= '' then return 'forced_' .. forced, 0 end
  local state = b[1] or 'closed'
  return state, tonumber(b[3] or '0')
end

local function breaker_open(key, window, now, open_ms, max_open_ms)
  local openings = tonumber(redis.call('HGET', key, 'openings') or '0') + 1
  local duration = math.min(open_ms * 2 ^ (openings - 1), max_open_ms)
  redis.call('HSET', key, 'state', 'open', 'openings', openings,
    'open_until', string.format('%d', now + duration), 'probes', 0, 'probe_ok', 0)
  redis.call('DEL', window)
  return string.format('%d', duration)
end

-- Record one call's outcome ('ok' | 'fail' | 'slow'); returns the transition ('' if none) and a
-- detail (the open duration in ms, or the failure/slow rates that tripped it).
local function breaker_record(key, window, outcome, probe, now, p)
  local state, _ = breaker_state(key, now)
  if string.sub(state, 1, 7) == 'forced_' then return '', '' end
  if state == 'half_open' then
    if probe ~= '1' then return '', '' end
    if outcome ~= 'ok' then
      return 'half_open>open', breaker_open(key, window, now, p[5], p[6])
    end
    local ok = redis.call('HINCRBY', key, 'probe_ok', 1)
    if ok >= p[7] then
      redis.call('HSET', key, 'state', 'closed', 'openings', 0, 'probes', 0, 'probe_ok', 0)
      redis.call('DEL', window)
      return 'half_open>closed', ''
    end
    return '', ''
  end
  if state == 'open' then return '', '' end
  local second = math.floor(now / 1000)
  redis.call('HINCRBY', window, second .. ':c', 1)
  if outcome == 'fail' then redis.call('HINCRBY', window, second .. ':f', 1) end
  if outcome == 'slow' then redis.call('HINCRBY', window, second .. ':s', 1) end
  redis.call('EXPIRE', window, p[1] * 2)
  local calls, fails, slows, stale = 0, 0, 0, {}
  local buckets = redis.call('HGETALL', window)
  for i = 1, #buckets, 2 do
    local s, kind = string.match(buckets[i], '^(%d+):(%a)$')
    if tonumber(s) <= second - p[1] then
      stale[#stale + 1] = buckets[i]
    elseif kind == 'c' then calls = calls + tonumber(buckets[i + 1])
    elseif kind == 'f' then fails = fails + tonumber(buckets[i + 1])
    else slows = slows + tonumber(buckets[i + 1]) end
  end
  if #stale > 0 then redis.call('HDEL', window, unpack(stale)) end
  if calls >= p[2] and (fails * 100 >= p[3] * calls or slows * 100 >= p[4] * calls) then
    local duration = breaker_open(key, window, now, p[5], p[6])
    return 'closed>open', string.format('%d/%d failed, %d/%d slow; open %s ms', fails, calls, slows, calls, duration)
  end
  return '', ''
end
