-- File one answer in the cache's Redis tier (gateway/cache/engine.py, _write_stores): its exact key,
-- and, for an answer the semantic tier may serve, its partition's two counts (entries, and answers
-- stored since the last hit), each living as long as the partition's longest-lived entry.
-- The lead on the exact key (cache_lookup.lua) is let go in the same step: a request waiting for this
-- answer finds it the moment the lead is gone.
-- KEYS: exact key, partition count, partition misses, lead (one partition: one hash tag, one slot).
-- ARGV: the stored value, its TTL in seconds, "1" if the partition is counted.
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('DEL', KEYS[4])
if ARGV[3] == "1" then
  for i = 2, 3 do
    redis.call('INCR', KEYS[i])
    redis.call('EXPIRE', KEYS[i], ARGV[2], 'NX')
    redis.call('EXPIRE', KEYS[i], ARGV[2], 'GT')
  end
end
return 1
