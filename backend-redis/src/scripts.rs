//! The Lua scripts: each lock operation is one `EVALSHA` of one of these, with the keys in
//! `KEYS`, so the server runs it atomically.

use std::sync::LazyLock;

use redis::Script;

/// Takes the lock if it is free or already ours (same owner: a retake with a new grant).
///
/// Every grant's token is `max(counter + 1, server TIME in µs)`, written back to the fence
/// counter, which is never deleted. Tokens therefore rise across releases and expiries, and
/// also across anything that takes the counter back while the server clock keeps going: a
/// restart without persistence (counter missing), a restart from an older RDB snapshot or
/// an append-only file that lost its last second, a failover to a replica that missed the
/// latest grants. Counting from the stored counter alone repeated the tokens handed out
/// after the snapshot. Redlock passes no counter key: token `0`.
///
/// Lua numbers are doubles: a counter at or above 2^53 - 1 (corrupted, or written by
/// something else) would make `counter + 1` round back to itself, and `1e20` formats as a
/// negative `%d`; such a counter is refused with an error before anything is written.
pub(crate) const ACQUIRE_LUA: &str = r"
-- KEYS[1] lock key; KEYS[2] fence counter (single instance only)
-- ARGV[1] TTL in ms; ARGV[2] owner; ARGV[3] value suffix ':<unix ms>:<nonce>:<owner>'
local current = redis.call('GET', KEYS[1])
if current and string.match(current, '^%d+:%d+:%x+:(.*)$') ~= ARGV[2] then
  return {0, current, redis.call('PTTL', KEYS[1])}
end
local token = 0
if KEYS[2] then
  local now = redis.call('TIME')
  token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local raw = redis.call('GET', KEYS[2])
  local last = tonumber(raw)
  if last and last >= 9007199254740991 then
    return redis.error_reply('ANYLOCK fence counter ' .. KEYS[2] .. ' holds ' .. raw ..
      ', not an integer below 2^53-1: tokens could repeat; nothing was written')
  end
  if last and last >= token then
    token = last + 1
  end
  redis.call('SET', KEYS[2], string.format('%d', token))
end
local value = string.format('%d', token) .. ARGV[3]
if current then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[1])
else
  redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[1])
end
return {1, value}
";

/// Extends the lock only if it still holds exactly our value; never re-creates it.
pub(crate) const REFRESH_LUA: &str = r"
-- KEYS[1] lock key; ARGV[1] our value; ARGV[2] TTL in ms
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if current then
  return current
end
return 0
";

/// Deletes the lock only if it still holds exactly our value, and wakes waiters.
pub(crate) const RELEASE_LUA: &str = r"
-- KEYS[1] lock key; ARGV[1] our value; ARGV[2] release channel
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
";

/// An operator's break: deletes whatever grant holds the lock and wakes waiters; returns
/// the removed value and its `PTTL`. The fence counter is untouched, so tokens keep rising.
pub(crate) const BREAK_LUA: &str = r"
-- KEYS[1] lock key; ARGV[1] release channel
local current = redis.call('GET', KEYS[1])
if not current then
  return false
end
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], 'released')
return {current, pttl}
";

/// Reads the value and remaining TTL together (atomically).
pub(crate) const INSPECT_LUA: &str = r"
-- KEYS[1] lock key
local current = redis.call('GET', KEYS[1])
if current then
  return {current, redis.call('PTTL', KEYS[1])}
end
return false
";

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
pub(crate) static REFRESH: LazyLock<Script> = LazyLock::new(|| Script::new(REFRESH_LUA));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
pub(crate) static BREAK: LazyLock<Script> = LazyLock::new(|| Script::new(BREAK_LUA));
