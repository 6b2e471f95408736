-- void: an admission step its caller stopped waiting for (Redis stalled; the request was decided
-- without Redis) may have run, or may still run when Redis resumes. Undo whatever it took, and mark
-- the request so that admission.lua takes nothing if the step runs after this. Either order ends the
-- same: nothing held for a request Redis did not admit.
--
-- (The marker may hold 'ok', set by a cluster's admission step that took its holds: voiding it
-- turns it into 1, so that step, sent again, takes nothing.)
-- KEYS: the request's void marker, then per limit its log (and running sum, for tpm), then per budget
--       its reservations log and reserved sum, then the in-flight log of each deployment of the chain
--       that has a concurrency limit (admission may have taken a slot on one of them)
-- ARGV: request id, tokens reserved, cost reserved (units), the marker's ttl s, number of limits,
--       per limit: kind (r|t|c), number of budgets, per budget: the amount it reserved (admission.lua)

local rid, tokens = ARGV[1], ARGV[2]
redis.call('SET', KEYS[1], 1, 'EX', ARGV[4])
local k, a = 2, 6
for _ = 1, tonumber(ARGV[5]) do
  local kind = ARGV[a]
  a = a + 1
  if kind == 't' then
    if redis.call('ZREM', KEYS[k], rid .. '|' .. tokens) == 1 then redis.call('DECRBY', KEYS[k + 1], tokens) end
    k = k + 2
  else
    redis.call('ZREM', KEYS[k], rid)
    k = k + 1
  end
end
for i = 1, tonumber(ARGV[a]) do
  local amount = ARGV[a + i]
  if redis.call('ZREM', KEYS[k], rid .. '|' .. amount) == 1 then redis.call('DECRBY', KEYS[k + 1], amount) end
  k = k + 2
end
for i = k, #KEYS do redis.call('ZREM', KEYS[i], rid) end
return 1
