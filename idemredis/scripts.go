package idemredis

import "github.com/redis/go-redis/v9"

// The Lua scripts run on the server, each atomically: that is what makes a settle fenced (the
// check that this consumer still owns the entry and the act on it cannot be split by a
// takeover) and a publish deduplicated (the check of the dedup key and the XADD cannot be
// split by a concurrent republish). They use the server's clock (TIME), never the client's.

// receiveScript moves the group's due naks back to its retry stream, claims for this consumer
// up to max entries whose lease expired, from the stream and the retry stream, then reads new
// entries of both, and returns {entries, last ids}: each entry is {index, id, fields, count},
// and the last ids are those of the newest entries of both streams, from which a blocking XREAD
// waits for anything newer.
//
// A lease is kept in the pending entry's idle time, shifted: a consumer with lease L sets the
// idle time of what it receives or extends to expiry−L, and every consumer claims at idle time
// expiry. So each delivery expires after its own owner's lease, whatever the lease of the
// consumer that claims it.
//
// KEYS: stream, retry stream, delayed set, cursor hash. ARGV: group, consumer, expiry ms,
// expiry−lease ms, max.
var receiveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
for _, m in ipairs(due) do
  local d = cmsgpack.unpack(m)
  redis.call('XADD', KEYS[2], '*', unpack(d[3]))
  redis.call('ZREM', KEYS[3], m)
end
local out = {}
local want = tonumber(ARGV[5])
for i = 1, 2 do
  if want <= 0 then break end
  local cursor = redis.call('HGET', KEYS[4], tostring(i)) or '0-0'
  local r = redis.call('XAUTOCLAIM', KEYS[i], ARGV[1], ARGV[2], ARGV[3], cursor, 'COUNT', want)
  redis.call('HSET', KEYS[4], tostring(i), r[1])
  for _, e in ipairs(r[2]) do
    if e and e[2] then
      local p = redis.call('XPENDING', KEYS[i], ARGV[1], e[1], e[1], 1)
      if #p == 1 then
        redis.call('XCLAIM', KEYS[i], ARGV[1], ARGV[2], 0, e[1], 'IDLE', ARGV[4], 'JUSTID')
        out[#out + 1] = {i, e[1], e[2], p[1][4]}
        want = want - 1
      end
    end
  end
end
for i = 1, 2 do
  if want <= 0 then break end
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want, 'STREAMS', KEYS[i], '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      redis.call('XCLAIM', KEYS[i], ARGV[1], ARGV[2], 0, e[1], 'IDLE', ARGV[4], 'JUSTID')
      out[#out + 1] = {i, e[1], e[2], 1}
      want = want - 1
    end
  end
end
local last = {}
for i = 1, 2 do
  local r = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)
  if #r == 1 then last[i] = r[1][1] else last[i] = '0-0' end
end
return {out, last}
`)

// settleScript acts on one pending entry only if this consumer still owns it with the delivery
// count it was received with: a worker whose lease was taken over (the count went up, or the
// owner changed) or whose entry was settled cannot ack, extend or nak it. It returns 1 when it
// acted, 0 when the fence refused.
//
// An entry trimmed from its stream (MAXLEN, XTRIM) while this consumer holds it is still in its
// hands: release and delay then re-add the consumer's copy of its fields (ARGV 10 on, as it was
// read) through the delayed set, instead of releasing a pending entry without content, which
// the next claim drops, or acking it with no copy made.
//
// KEYS: the entry's stream, the group's delayed set. ARGV: group, consumer, id, count, op,
// arg1, arg2, delete (1 on a retry stream: its entries are the group's own and are deleted once
// acked), the attempt of a re-added copy, then the entry's fields. Ops: ack; extend (set the
// idle time to arg1, expiry−lease: see receiveScript); release (idle time arg1, past expiry, so
// the next claim takes it, with delivery count arg2; re-added at once when trimmed); delay
// (re-add after arg1 ms).
var settleScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] or tostring(p[1][4]) ~= ARGV[4] then
  return 0
end
local op = ARGV[5]
if op == 'extend' then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[6], 'JUSTID')
  return 1
end
if op == 'release' or op == 'delay' then
  local r = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
  if op == 'release' and #r == 1 then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[6], 'RETRYCOUNT', ARGV[7], 'JUSTID')
    return 1
  end
  local delay = 0
  if op == 'delay' then delay = tonumber(ARGV[6]) end
  local f
  if #r == 1 then
    f = r[1][2]
  else
    f = {}
    for j = 10, #ARGV do f[#f + 1] = ARGV[j] end
  end
  local nf = {}
  local published = string.match(ARGV[3], '^(%d+)')
  for j = 1, #f, 2 do
    if f[j] == '` + FieldPublishedAt + `' then
      if ARGV[8] == '1' then published = f[j + 1] end
    elseif f[j] ~= '` + FieldAttempt + `' then
      nf[#nf + 1] = f[j]
      nf[#nf + 1] = f[j + 1]
    end
  end
  nf[#nf + 1] = '` + FieldAttempt + `'
  nf[#nf + 1] = ARGV[9]
  nf[#nf + 1] = '` + FieldPublishedAt + `'
  nf[#nf + 1] = published
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], now + delay, cmsgpack.pack({KEYS[1], ARGV[3], nf}))
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
if ARGV[8] == '1' then
  redis.call('XDEL', KEYS[1], ARGV[3])
end
return 1
`)

// publishScript adds one entry unless its dedup key says it was published within the window,
// and returns the entry's id (the earlier one for a duplicate).
//
// KEYS: stream, dedup key ("" when deduplication is off). ARGV: window ms, max length (0: no
// trimming), then the entry's fields.
var publishScript = redis.NewScript(`
if ARGV[1] ~= '0' then
  local prev = redis.call('GET', KEYS[2])
  if prev then return prev end
end
local id
if ARGV[2] ~= '0' then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
else
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
end
if ARGV[1] ~= '0' then
  redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
end
return id
`)

// closeScript removes this consumer from the group's consumer list if it holds no pending
// entry (removing one that does would drop its entries from the pending list for good).
//
// KEYS: stream, retry stream. ARGV: group, consumer.
var closeScript = redis.NewScript(`
for i = 1, 2 do
  local p = redis.call('XPENDING', KEYS[i], ARGV[1], '-', '+', 1, ARGV[2])
  if #p == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[i], ARGV[1], ARGV[2])
  end
end
return 1
`)
