-- settle: after the call, turn an admitted request's holds into what really happened, atomically.
-- Token estimates become actual usage, the concurrency slot is freed, budget reservations become
-- spend. A failed call (or a client gone before the first token) settles with zero: all released.
--
-- It also records the outcome of every provider attempt the request made in that deployment's
-- circuit breaker (requires breakers.lua).
--
-- KEYS: per tpm limit: log, sum; per concurrency limit: log; per budget: spent, reservations, sum;
--       per attempt: breaker, breaker window
-- ARGV: request id, tokens estimated, tokens used, number of tpm limits, number of concurrency
--       limits, number of budgets, per budget: what it reserved and what was spent (cost units, or
--       tokens for a token cap), number of attempts,
--       per attempt: outcome (ok | fail | slow), probe (1|0), 7 policy numbers,
--       number of providers paid, per provider: the cost in units, the counter's ttl s
--       (KEYS go on with each paid provider's spend counter for today)
-- The last KEYS entry is the ledger stream and the last ARGV entry the request's ledger record: it is
-- queued first, in the same step (one round trip at the end of a request, and the record is durable
-- before anything else changes).
-- Returns {each budget's spent total after this request (-1 where the period's counter is gone),
--          each attempt's breaker transition ('' | 'closed>open' | ...), and its detail}.

-- (On a cluster the stream is in a slot of its own: the record is queued apart, first, and this
-- script runs once per slot with '' for the record and no stream key; docs/cluster.md.)
if ARGV[#ARGV] ~= '' then redis.call('XADD', KEYS[#KEYS], '*', 'r', ARGV[#ARGV]) end
local rid, estimated, actual = ARGV[1], ARGV[2], ARGV[3]
local ntpm, nconc, nbudgets = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local k = 1
for _ = 1, ntpm do
  local log, sum = KEYS[k], KEYS[k + 1]
  k = k + 2
  local score = redis.call('ZSCORE', log, rid .. '|' .. estimated)
  if score then
    redis.call('ZREM', log, rid .. '|' .. estimated)
    redis.call('ZADD', log, score, rid .. '|' .. actual)
    redis.call('INCRBY', sum, string.format('%d', tonumber(actual) - tonumber(estimated)))
  end
end
for _ = 1, nconc do
  redis.call('ZREM', KEYS[k], rid)
  k = k + 1
end
local totals = {}
local a = 7
for i = 1, nbudgets do
  local spent, log, sum = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  local reserved, spent_now = ARGV[a], ARGV[a + 1]
  k, a = k + 3, a + 2
  -- Settling twice must not count twice: spend is added only with the reservation it replaces.
  if redis.call('ZREM', log, rid .. '|' .. reserved) == 1 then
    redis.call('DECRBY', sum, reserved)
    if redis.call('EXISTS', spent) == 1 then
      totals[i] = redis.call('INCRBY', spent, spent_now)
    else
      totals[i] = -1
    end
  else
    totals[i] = -1
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local transitions, details = {}, {}
local attempts = tonumber(ARGV[a])
a = a + 1
for i = 1, attempts do
  local policy = {}
  for j = 1, 7 do policy[j] = tonumber(ARGV[a + 1 + j]) end
  transitions[i], details[i] = breaker_record(KEYS[k], KEYS[k + 1], ARGV[a], ARGV[a + 1], now, policy)
  k, a = k + 2, a + 9
end
-- What each provider was paid today, for its daily spend cap (read by deployments.lua).
for _ = 1, tonumber(ARGV[a]) do
  redis.call('INCRBY', KEYS[k], ARGV[a + 1])
  redis.call('EXPIRE', KEYS[k], ARGV[a + 2])
  k, a = k + 1, a + 2
end
return {totals, transitions, details}
