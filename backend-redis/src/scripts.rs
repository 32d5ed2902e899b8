//! The Lua scripts: each lock operation is one `EVALSHA` of one of these, with the keys in
//! `KEYS`, so the server runs it atomically.

use std::sync::LazyLock;

use redis::Script;

/// Lua that defines `draw_token(counter, micros)`, the one fence-counter rule of the lock's
/// and the semaphore's acquire scripts (both start with it): the token is
/// max(counter + 1, `micros`), read and bumped with one `SET counter <micros> GET` (Redis
/// ≥ 6.2; older servers refuse the option, writing nothing, and get `GET` then `SET`), and
/// written back. A counter at or above 2^53 − 1 (a Lua number could not count past it) is
/// put back as it was and refused: the function returns `nil` and the error reply its
/// caller must return. A counter key that is not a string fails the script (`WRONGTYPE`)
/// before anything is written.
macro_rules! draw_token_lua {
    () => {
        r"
local function draw_token(counter, micros)
  local token = micros
  local raw = redis.pcall('SET', counter, string.format('%d', token), 'GET')
  local wrote = type(raw) ~= 'table'
  if not wrote then
    raw = redis.call('GET', counter)
  end
  local last = tonumber(raw)
  if last and last >= 9007199254740991 then
    if wrote then
      redis.call('SET', counter, raw)
    end
    return nil, redis.error_reply('ANYLOCK fence counter ' .. counter .. ' holds ' .. raw ..
      ', not an integer below 2^53-1: tokens could repeat; nothing was written')
  end
  if last and last >= token then
    token = last + 1
    wrote = false
  end
  if not wrote then
    redis.call('SET', counter, string.format('%d', token))
  end
  return token
end
"
    };
}
pub(crate) use draw_token_lua;

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
/// The counter is read and bumped by one `SET counter <now> GET` (Redis ≥ 6.2): the reply
/// is the old counter, and only when it is at or above the clock (a clock stepped back,
/// two grants in one microsecond) does a second `SET` write `counter + 1`. A server that
/// refuses the `GET` option gets the `GET` and `SET` of older versions. The counter is only
/// touched once the lock is known to be free or ours, so a refusal writes nothing to it.
///
/// Lua numbers are doubles: a counter at or above 2^53 - 1 (corrupted, or written by
/// something else) would make `counter + 1` round back to itself, and `1e20` formats as a
/// negative `%d`; such a counter is refused with an error, the counter put back as it was
/// (its value) and nothing else written.
///
/// Without a counter key and without a note (Redlock's usual call) the value is known
/// before the script runs, so one `SET lock value NX PX ttl GET` (Redis ≥ 7.0; older
/// servers get the `GET` first) both takes a free lock and reads a held one.
///
/// A grant with a note writes the note key in the same script (both fields, so nothing of
/// an older note is left), bound to the new value and with the same `PX`. A fresh grant
/// without a note leaves the key alone: the lock key was gone, and the note key of this
/// client's grants never outlives its lock key (same `PX`, extended together). A retake
/// without a note deletes it. A note is shown only while its `grant` field equals the lock
/// value, so a leftover (written before a pre-notes client's retake) is never shown, and
/// release and break delete it. A refusal returns the holder's note, when it is bound to
/// the holder's value.
pub(crate) const ACQUIRE_LUA: &str = concat!(
    draw_token_lua!(),
    r"
-- KEYS[1] lock key; KEYS[2] note key; KEYS[3] fence counter (single instance only)
-- ARGV[1] TTL in ms; ARGV[2] owner; ARGV[3] value suffix
-- ':<unix ms>:<nonce>:<owner>'; ARGV[4] the note ('' for none)
local current
if not KEYS[3] and ARGV[4] == '' then
  current = redis.pcall('SET', KEYS[1], '0' .. ARGV[3], 'NX', 'PX', ARGV[1], 'GET')
  if not current then
    return {1, '0' .. ARGV[3]}
  end
  if type(current) == 'table' then
    -- A server before 7.0 refuses NX with GET (nothing written): read first.
    current = redis.call('GET', KEYS[1])
  end
else
  current = redis.call('GET', KEYS[1])
end
if current and string.match(current, '^%d+:%d+:%x+:(.*)$') ~= ARGV[2] then
  local bound = redis.pcall('HMGET', KEYS[2], 'grant', 'note')
  local note = ''
  if bound[1] == current and type(bound[2]) == 'string' then note = bound[2] end
  return {0, current, redis.call('PTTL', KEYS[1]), note}
end
local token = 0
if KEYS[3] then
  local now = redis.call('TIME')
  local refused
  token, refused = draw_token(KEYS[3], tonumber(now[1]) * 1000000 + tonumber(now[2]))
  if refused then
    return refused
  end
end
local value = string.format('%d', token) .. ARGV[3]
-- The note before the lock: a user whose ACL lacks HSET fails here, before anything is
-- granted. A retake without a note drops the note of the grant it replaces, which could
-- otherwise outlive it (a shorter TTL) and be kept alive by the next holder's refreshes.
if current and ARGV[4] == '' then
  redis.call('DEL', KEYS[2])
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], 'grant', value, 'note', ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
if current then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[1])
else
  redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[1])
end
return {1, value}
"
);

/// Extends the lock only if it still holds exactly our value; never re-creates it. The
/// note key is extended with it, without reading it first: while the lock holds our value,
/// only our own acquire has written the note key (any other grant changes the value first),
/// so it holds our note, an older grant's unbound note (never shown, and gone with ours), or
/// nothing (`PEXPIRE` of a missing key does nothing).
pub(crate) const REFRESH_LUA: &str = r"
-- KEYS[1] lock key; KEYS[2] note key; ARGV[1] our value; ARGV[2] TTL in ms
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
if current then
  return current
end
return 0
";

/// Deletes the lock (and its note) only if it still holds exactly our value, and wakes
/// waiters.
pub(crate) const RELEASE_LUA: &str = r"
-- KEYS[1] lock key; KEYS[2] note key; ARGV[1] our value; ARGV[2] release channel
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
";

/// An operator's break: deletes whatever grant holds the lock (and its note) and wakes
/// waiters; returns the removed value, its `PTTL` and its note. The fence counter is
/// untouched, so tokens keep rising.
pub(crate) const BREAK_LUA: &str = r"
-- KEYS[1] lock key; KEYS[2] note key; ARGV[1] release channel
local current = redis.call('GET', KEYS[1])
if not current then
  return false
end
local pttl = redis.call('PTTL', KEYS[1])
local bound = redis.pcall('HMGET', KEYS[2], 'grant', 'note')
local note = ''
if bound[1] == current and type(bound[2]) == 'string' then note = bound[2] end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[1], 'released')
return {current, pttl, note}
";

/// Reads the value, remaining TTL and note together (atomically).
pub(crate) const INSPECT_LUA: &str = r"
-- KEYS[1] lock key; KEYS[2] note key
local current = redis.call('GET', KEYS[1])
if current then
  local bound = redis.pcall('HMGET', KEYS[2], 'grant', 'note')
  local note = ''
  if bound[1] == current and type(bound[2]) == 'string' then note = bound[2] end
  return {current, redis.call('PTTL', KEYS[1]), note}
end
return false
";

/// Reads many locks at once for a listing: `KEYS` are pairs (lock key, note key); the
/// reply has one entry per pair, `false` when the lock key is gone (expired or released
/// since the scan) or is not a string (not ours), else `{value, PTTL, note}`. Read-only.
pub(crate) const READ_MANY_LUA: &str = r"
local out = {}
for i = 1, #KEYS, 2 do
  local current = redis.pcall('GET', KEYS[i])
  if type(current) == 'string' then
    local bound = redis.pcall('HMGET', KEYS[i + 1], 'grant', 'note')
    local note = ''
    if bound[1] == current and type(bound[2]) == 'string' then note = bound[2] end
    out[#out + 1] = {current, redis.call('PTTL', KEYS[i]), note}
  else
    out[#out + 1] = false
  end
end
return out
";

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
pub(crate) static REFRESH: LazyLock<Script> = LazyLock::new(|| Script::new(REFRESH_LUA));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
pub(crate) static BREAK: LazyLock<Script> = LazyLock::new(|| Script::new(BREAK_LUA));
pub(crate) static READ_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(READ_MANY_LUA));

/// Every script, for loading them all at connect.
pub(crate) static ALL: [&LazyLock<Script>; 6] =
    [&ACQUIRE, &REFRESH, &RELEASE, &BREAK, &INSPECT, &READ_MANY];
