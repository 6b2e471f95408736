-- claim: one deployment's part of admission on a Valkey Cluster, where each deployment's keys live in
-- a slot of their own (docs/cluster.md): its breaker's state, and a concurrency slot if it has a
-- limit, may be called and has room. The same rules as deployments.lua, for one deployment; its
-- provider's spend cap is read apart (another slot) and passed in as `capped`.
--
-- KEYS: the admission step's void marker on this deployment's slot (void.lua), its breaker, then its
--       in-flight log (only when a slot is to be taken)
-- ARGV: request id, lease ms, capped (1|0), '' (the cap: applied by the caller), the concurrency
--       limit ('' for none, or when no slot is to be taken)
-- Returns {state, 1 if a slot was taken}: state as deployments.lua says, or 'void' (the caller gave
-- up on this step before it ran: nothing was taken).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 1 then return {'void', 0} end
if ARGV[3] == '1' then return {'capped', 0} end
-- Sent again (the connection dropped before the answer): the slot this request already holds.
if ARGV[5] ~= '' and redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  local state, open_until = breaker_state(KEYS[2], now)
  if state == 'half_open' or (state == 'open' and now >= open_until) then state = 'probe' end
  return {state, 1}
end
local states, slot, slot_log = deployment_states(2, 4, 1, now)
if slot > 0 then deployment_take(slot_log, ARGV[1], now, tonumber(ARGV[2])) end
return {states[1], slot}
