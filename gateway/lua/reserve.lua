-- reserve: the state of deployments a request did not read at admission (the smart model's chain, when
-- a refusal escalates to it), and a slot on the first that may be called and has room; or a slot on a
-- limited deployment a request fails over to. Same rules as admission (requires breakers.lua and
-- deployments.lua); refuses nothing: a full deployment is reported 'full' and skipped by the caller.
--
-- KEYS: per deployment, as deployments.lua says. ARGV: request id, lease ms, number of deployments,
-- then per deployment as deployments.lua says.
-- Returns {states, index of the deployment a slot was taken on (0: none)}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local states, slot, slot_log = deployment_states(1, 4, tonumber(ARGV[3]), now)
if slot > 0 then deployment_take(slot_log, ARGV[1], now, tonumber(ARGV[2])) end
return {states, slot}
