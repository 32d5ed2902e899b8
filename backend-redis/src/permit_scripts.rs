//! The Lua scripts of semaphores (permits; `docs/redis.md`, "Semaphores"): each permit
//! operation is one `EVALSHA` of one of these, with every key in `KEYS`, so the server runs
//! it atomically.
//!
//! A semaphore's permits live in a sorted set (member = the grant value, in the lock
//! value's format `<token>:<acquired unix ms>:<nonce>:<owner>`; score = the permit's expiry
//! in the server's Unix milliseconds, from `TIME` inside the script), next to a hash of
//! records (`o:<owner>` = that owner's grant value, `g:<grant value>` = `<limit>:<note>`)
//! and the semaphore's own fence counter. A permit is live while its score is above the
//! server's clock; expired ones are dropped by the next grant.

use std::sync::LazyLock;

use redis::Script;

use crate::scripts::draw_token_lua;

/// Takes a permit if fewer than `limit` *other* owners hold a live one; a live permit of
/// the same owner is replaced by the new grant (never a second permit).
///
/// Reads before it writes: a refusal (all permits taken, or a live permit recorded with
/// another limit) writes nothing, and a key of the wrong type fails a read (`WRONGTYPE`)
/// before anything is written. Only a grant drops the expired permits (and their records).
///
/// The limit check reads one live permit's record (the one that expires first): the script
/// admits a limit only when it equals the live permits' limit, so every live permit has the
/// same one, and one record stands for all of them (O(log N), where reading every record
/// would cost O(N) per acquire).
///
/// The token is drawn by the lock's own Lua (`draw_token`, the same text, from
/// `scripts.rs`) on the semaphore's own counter: max(counter + 1, server `TIME` in µs), a
/// counter at or above 2^53 − 1 refused and put back as it was. The counter is never
/// deleted and has no TTL.
///
/// The permit set and the record hash expire (`PEXPIREAT`) with their longest-lived permit,
/// so an abandoned semaphore leaves no keys behind but its counter.
pub(crate) const ACQUIRE_PERMIT_LUA: &str = concat!(
    draw_token_lua!(),
    r"
-- KEYS[1] permits (sorted set); KEYS[2] records (hash); KEYS[3] fence counter
-- ARGV[1] TTL in ms; ARGV[2] owner; ARGV[3] value suffix ':<unix ms>:<nonce>:<owner>';
-- ARGV[4] limit; ARGV[5] note ('' for none)
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
local now_ms = math.floor(micros / 1000)
local live = '(' .. string.format('%d', now_ms)
local mine = redis.call('HGET', KEYS[2], 'o:' .. ARGV[2])
if mine then
  local score = redis.call('ZSCORE', KEYS[1], mine)
  if not score or tonumber(score) <= now_ms then mine = false end
end
local held = redis.call('ZCOUNT', KEYS[1], live, '+inf')
local first = redis.call('ZRANGEBYSCORE', KEYS[1], live, '+inf', 'WITHSCORES', 'LIMIT', 0, 2)
if held > 0 then
  local record = redis.call('HGET', KEYS[2], 'g:' .. first[1])
  local limit = record and string.match(record, '^(%d+):')
  if limit and limit ~= ARGV[4] then
    return {2, limit}
  end
end
local others = held
if mine then others = held - 1 end
if others >= tonumber(ARGV[4]) then
  local at = 1
  if first[1] == mine then at = 3 end
  local record = redis.call('HGET', KEYS[2], 'g:' .. first[at])
  local note = record and string.match(record, '^%d+:(.*)$') or ''
  return {0, first[at], tonumber(first[at + 1]) - now_ms, note}
end
local token, refused = draw_token(KEYS[3], micros)
if refused then
  return refused
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms)
for _, member in ipairs(expired) do
  redis.call('HDEL', KEYS[2], 'g:' .. member)
  local owner = string.match(member, '^%d+:%d+:%x+:(.*)$')
  if owner and redis.call('HGET', KEYS[2], 'o:' .. owner) == member then
    redis.call('HDEL', KEYS[2], 'o:' .. owner)
  end
end
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
end
if mine then
  redis.call('ZREM', KEYS[1], mine)
  redis.call('HDEL', KEYS[2], 'g:' .. mine)
end
local value = string.format('%d', token) .. ARGV[3]
redis.call('ZADD', KEYS[1], string.format('%d', now_ms + tonumber(ARGV[1])), value)
redis.call('HSET', KEYS[2], 'o:' .. ARGV[2], value, 'g:' .. value, ARGV[4] .. ':' .. ARGV[5])
local until_ms = string.format('%d', tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]))
redis.call('PEXPIREAT', KEYS[1], until_ms)
redis.call('PEXPIREAT', KEYS[2], until_ms)
return {1, value}
"
);

/// Extends a permit only if exactly this grant is still live; never re-creates one.
/// Replies `1` extended, `0` gone (released, or replaced by its owner's retake), `-1`
/// expired (its place may be taken). The keys' expiry follows the longest-lived permit.
pub(crate) const REFRESH_PERMIT_LUA: &str = r"
-- KEYS[1] permits; KEYS[2] records; ARGV[1] our grant value; ARGV[2] TTL in ms
local now = redis.call('TIME')
local now_ms = math.floor((tonumber(now[1]) * 1000000 + tonumber(now[2])) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
if tonumber(score) <= now_ms then
  return -1
end
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now_ms + tonumber(ARGV[2])), ARGV[1])
local until_ms = string.format('%d', tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]))
redis.call('PEXPIREAT', KEYS[1], until_ms)
redis.call('PEXPIREAT', KEYS[2], until_ms)
return 1
";

/// Removes exactly this grant (never another's) with its records, and wakes waiters on
/// the lock's release channel; `1` when it was there, `0` otherwise (nothing published).
pub(crate) const RELEASE_PERMIT_LUA: &str = r"
-- KEYS[1] permits; KEYS[2] records; ARGV[1] our grant value; ARGV[2] release channel
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('HDEL', KEYS[2], 'g:' .. ARGV[1])
local owner = string.match(ARGV[1], '^%d+:%d+:%x+:(.*)$')
if owner and redis.call('HGET', KEYS[2], 'o:' .. owner) == ARGV[1] then
  redis.call('HDEL', KEYS[2], 'o:' .. owner)
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]
if last then
  local until_ms = string.format('%d', tonumber(last))
  redis.call('PEXPIREAT', KEYS[1], until_ms)
  redis.call('PEXPIREAT', KEYS[2], until_ms)
else
  redis.call('DEL', KEYS[2])
end
redis.call('PUBLISH', ARGV[2], 'released')
return 1
";

/// Reads the live permits (read-only): `{grant value, remaining ms, note}` each, in
/// expiry order.
pub(crate) const INSPECT_PERMITS_LUA: &str = r"
-- KEYS[1] permits; KEYS[2] records
local now = redis.call('TIME')
local now_ms = math.floor((tonumber(now[1]) * 1000000 + tonumber(now[2])) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now_ms), '+inf',
  'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local record = redis.call('HGET', KEYS[2], 'g:' .. live[i])
  local note = record and string.match(record, '^%d+:(.*)$') or ''
  out[#out + 1] = {live[i], tonumber(live[i + 1]) - now_ms, note}
end
return out
";

pub(crate) static ACQUIRE_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_PERMIT_LUA));
pub(crate) static REFRESH_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(REFRESH_PERMIT_LUA));
pub(crate) static RELEASE_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RELEASE_PERMIT_LUA));
pub(crate) static INSPECT_PERMITS: LazyLock<Script> =
    LazyLock::new(|| Script::new(INSPECT_PERMITS_LUA));

/// Every permit script, for loading them all at connect.
pub(crate) static PERMIT_SCRIPTS: [&LazyLock<Script>; 4] = [
    &ACQUIRE_PERMIT,
    &REFRESH_PERMIT,
    &RELEASE_PERMIT,
    &INSPECT_PERMITS,
];
