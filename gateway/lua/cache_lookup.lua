-- The exact tier's lookup (gateway/cache/engine.py, _exact): the answer under an exact key and its
-- partition's two counts, and, on a miss, the lead for that key: the one request that asks the
-- provider while identical ones wait for its answer (SET NX with a TTL; none waits longer).
-- KEYS: exact key, partition count, partition misses, lead (one partition: one hash tag, one slot).
-- ARGV: the holder's name (its request id), the lead's TTL in milliseconds ("0": take no lead).
local found = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3])
local led = 0
if not found[1] and ARGV[2] ~= "0" then
  if redis.call('SET', KEYS[4], ARGV[1], 'NX', 'PX', ARGV[2]) then
    led = 1
  end
end
return {found[1], found[2], found[3], led}
