-- The deployments of a request's chain, in the order it will try them. Prepended (after breakers.lua)
-- to the scripts that read them: admission, and reserve for deployments admission did not read.
--
-- Each deployment gets its breaker's state, or 'capped' when its provider's spend today reached the
-- provider's daily cap, or 'full' when it has a concurrency limit and no free slot. A slot is taken
-- (deployment_take) on the first deployment that may be called and has room: the deployments after it
-- are called only if it fails, and take a slot then.
--
-- Per deployment, KEYS: breaker, then its provider's spend today (only if capped), then its in-flight
-- log (only if limited); ARGV: the cap in units ('' for none), the concurrency limit ('' for none).
-- Returns the states, the index of the deployment to take a slot on (0: none needed), that slot's log,
-- whether every deployment that may be called is full, and the next KEYS and ARGV positions.

local function deployment_states(k, a, count, now)
  local states, slot, slot_log = {}, 0, nil
  local chosen, full = false, false
  for i = 1, count do
    local state, open_until = breaker_state(KEYS[k], now)
    k = k + 1
    if state == 'half_open' or (state == 'open' and now >= open_until) then state = 'probe' end
    local cap, limit = ARGV[a], ARGV[a + 1]
    a = a + 2
    if cap ~= '' then
      if tonumber(redis.call('GET', KEYS[k]) or '0') >= tonumber(cap) then state = 'capped' end
      k = k + 1
    end
    local callable = state == 'closed' or state == 'probe' or state == 'forced_closed'
    if limit ~= '' then
      if callable and not chosen then
        redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now)
        if redis.call('ZCARD', KEYS[k]) < tonumber(limit) then
          chosen, slot, slot_log = true, i, KEYS[k]
        else
          state, full = 'full', true
        end
      end
      k = k + 1
    elseif callable then
      chosen = true
    end
    states[i] = state
  end
  return states, slot, slot_log, full and not chosen, k, a
end

local function deployment_take(slot_log, rid, now, lease)
  redis.call('ZADD', slot_log, now + lease, rid)
  redis.call('PEXPIRE', slot_log, lease + 1000)
end
