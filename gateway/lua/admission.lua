-- admit: one atomic step per request. Reads the configuration generation and the key's and tenant's
-- block markers, checks every rate limit (sliding logs: exact, no boundary doubling) and every budget,
-- and either commits all of them or nothing (a rejected request consumes nothing).
--
-- KEYS: the request's void marker (void.lua), key marker, tenant marker, generation (see mode),
--       then per limit: its log (rpm, concurrency) or its log and running sum (tpm),
--       then per budget: spent, reservations log, reserved sum,
--       then the breaker of each deployment in the model's chain
-- ARGV: request id, tokens estimate, cost (integer units; each budget says what it reserves), lease ms,
--       number of limits,
--       per limit: kind (r|t|c), limit, window ms,
--       number of budgets, per budget: limit, initial spent ('' when unknown), ttl s, hard (1|0),
--       amount this request reserves (cost units; tokens, for an end user's or session's token cap),
--       number of deployments, per deployment: its cap and concurrency limit (see deployments.lua),
--       the configuration generation the caller's caches reflect, or the mode on a cluster
--       (docs/cluster.md), where this script runs once per slot: '*' for the tenant's step (no
--       generation key: the caller reads it after this step), '-' for a model's step (KEYS start with
--       the void marker only: no markers, no generation; no budgets, no deployments)
--       (KEYS end with each deployment's breaker, spend counter and in-flight log, see deployments.lua)
-- Returns {outcome, index, retry ms, generation, used per limit, reset ms per limit, deployments, slot}
-- whatever the outcome (ok | limit | budget | init | blocked | stale | overloaded | void); budget: the
-- third item is what the refusing budget has spent and reserved; init: the index is the list of every
-- budget whose period Redis has no counter for (the caller reads them from the ledger); stale: the
-- configuration changed since the caller cached it, nothing was taken, re-read and ask again;
-- void: the caller gave up on this step (Redis stalled) and voided it before it ran: nothing was taken;
-- overloaded: every deployment that may be called is at its concurrency limit, nothing was taken.
-- On ok, deployments holds each chain deployment's state, in the order the request will try them:
-- closed | open | probe (may be tried as a half-open probe) | forced_open | forced_closed | capped |
-- full; slot is the index of the deployment whose concurrency slot the request now holds (0: none).
-- Requires breakers.lua and deployments.lua.
-- Numbers passed back to Redis are formatted with %d: Lua's default formatting turns large integers
-- into exponent notation, which INCRBY refuses.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode = ARGV[#ARGV]
local marker = redis.call('GET', KEYS[1])
-- On a cluster, a step the client sent again (its connection dropped before the answer came) finds
-- its own marker and answers as it did, taking nothing twice.
if marker == 'ok' and (mode == '*' or mode == '-') then return {'ok', 0, '0', '', {}, {}, {}, 0} end
if marker then return {'void', 0, '0', '', {}, {}} end
local generation, k = '', 2
if mode ~= '-' then
  k = 4
  if mode ~= '*' then
    generation = redis.call('GET', KEYS[4]) or ''
    k = 5
  end
  if redis.call('EXISTS', KEYS[2]) == 1 then return {'blocked', 'key', '0', generation, {}, {}} end
  if redis.call('EXISTS', KEYS[3]) == 1 then return {'blocked', 'tenant', '0', generation, {}, {}} end
  if mode ~= '*' and generation ~= mode then return {'stale', 0, '0', generation, {}, {}} end
end

local rid = ARGV[1]
local tokens = tonumber(ARGV[2])
local lease = tonumber(ARGV[4])
local a = 6

local function tokens_of(member)
  return tonumber(string.match(member, '|(%d+)$'))
end

local function expire_weighted(log, sum, cutoff)
  local expired = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  if #expired > 0 then
    local gone = 0
    for _, m in ipairs(expired) do gone = gone + tokens_of(m) end
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
    redis.call('DECRBY', sum, string.format('%d', gone))
  end
end

local limits, used, resets = {}, {}, {}
local violated, retry = 0, 0
for i = 1, tonumber(ARGV[5]) do
  local e = {kind = ARGV[a], limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]), log = KEYS[k]}
  a, k = a + 3, k + 1
  local oldest_reset = e.window
  if e.kind == 'r' then
    redis.call('ZREMRANGEBYSCORE', e.log, '-inf', now - e.window)
    e.used = redis.call('ZCARD', e.log)
    local oldest = redis.call('ZRANGE', e.log, 0, 0, 'WITHSCORES')
    if oldest[2] then oldest_reset = tonumber(oldest[2]) + e.window - now end
    if violated == 0 and e.used + 1 > e.limit then violated, retry = i, oldest_reset end
  elseif e.kind == 't' then
    e.sum = KEYS[k]
    k = k + 1
    expire_weighted(e.log, e.sum, now - e.window)
    e.used = tonumber(redis.call('GET', e.sum) or '0')
    local oldest = redis.call('ZRANGE', e.log, 0, 0, 'WITHSCORES')
    if oldest[2] then oldest_reset = tonumber(oldest[2]) + e.window - now end
    if violated == 0 and e.used + tokens > e.limit then
      violated, retry = i, e.window
      if tokens <= e.limit then
        -- the moment enough of the oldest entries leave the window
        local need, freed = e.used + tokens - e.limit, 0
        local members = redis.call('ZRANGE', e.log, 0, -1, 'WITHSCORES')
        for j = 1, #members, 2 do
          freed = freed + tokens_of(members[j])
          if freed >= need then
            retry = tonumber(members[j + 1]) + e.window - now
            break
          end
        end
      end
    end
  else
    redis.call('ZREMRANGEBYSCORE', e.log, '-inf', now)
    e.used = redis.call('ZCARD', e.log)
    oldest_reset = 0
    if violated == 0 and e.used + 1 > e.limit then violated, retry = i, 1000 end
  end
  limits[i] = e
  used[i] = string.format('%d', e.used)
  resets[i] = string.format('%d', oldest_reset)
end
if violated > 0 then
  return {'limit', violated, string.format('%d', retry), generation, used, resets}
end

local budgets, missing = {}, {}
for i = 1, tonumber(ARGV[a]) do
  budgets[i] = {
    limit = tonumber(ARGV[a + 1]), init = ARGV[a + 2], ttl = ARGV[a + 3], hard = ARGV[a + 4], amount = ARGV[a + 5],
    spent = KEYS[k], log = KEYS[k + 1], sum = KEYS[k + 2],
  }
  a, k = a + 5, k + 3
  if budgets[i].init == '' and redis.call('EXISTS', budgets[i].spent) == 0 then missing[#missing + 1] = i end
end
-- Periods with no counter yet (a new period, a new end user, or Redis lost it) are all asked for at
-- once: the caller reads them from the ledger and asks again. The first answer to arrive starts the
-- counter; every other request, concurrent or not, is then checked against it.
if #missing > 0 then return {'init', missing, '0', generation, used, resets} end
for i, b in ipairs(budgets) do
  local spent = redis.call('GET', b.spent)
  if not spent then
    redis.call('SET', b.spent, b.init, 'EX', b.ttl)
    spent = b.init
  end
  expire_weighted(b.log, b.sum, now)
  local taken = tonumber(spent) + tonumber(redis.call('GET', b.sum) or '0')
  if b.hard == '1' and taken + tonumber(b.amount) > b.limit then
    return {'budget', i, string.format('%d', taken), generation, used, resets}
  end
end

local states, slot, slot_log, overloaded = deployment_states(k, a + 2, tonumber(ARGV[a + 1]), now)
if overloaded then return {'overloaded', 0, '1000', generation, used, resets} end

for _, e in ipairs(limits) do
  if e.kind == 'r' then
    redis.call('ZADD', e.log, now, rid)
    redis.call('PEXPIRE', e.log, e.window + 1000)
  elseif e.kind == 't' then
    -- A request id already holding an entry (a batch item run again after its worker died) is
    -- counted once: the sum grows only with a new entry.
    if redis.call('ZADD', e.log, now, rid .. '|' .. ARGV[2]) == 1 then redis.call('INCRBY', e.sum, ARGV[2]) end
    redis.call('PEXPIRE', e.log, e.window + 1000)
    redis.call('PEXPIRE', e.sum, e.window + 1000)
  else
    redis.call('ZADD', e.log, now + lease, rid)
    redis.call('PEXPIRE', e.log, lease + 1000)
  end
end
for _, b in ipairs(budgets) do
  if redis.call('ZADD', b.log, now + lease, rid .. '|' .. b.amount) == 1 then redis.call('INCRBY', b.sum, b.amount) end
  redis.call('EXPIRE', b.log, b.ttl)
  redis.call('EXPIRE', b.sum, b.ttl)
end
if slot > 0 then deployment_take(slot_log, rid, now, lease) end
if mode == '*' or mode == '-' then redis.call('SET', KEYS[1], 'ok', 'PX', lease) end
return {'ok', 0, '0', generation, used, resets, states, slot}
