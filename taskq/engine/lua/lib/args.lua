-- args.lua: the checks of a call's ARGV, made at the top of every verb before its first
-- write. Redis does not roll a script back, so a bad argument met half-way would leave
-- half a change (a done bit without its counters, a lease record nobody can parse).
-- Each checker returns the argument converted (a number, or the string itself) or, when
-- it is bad, a harmless stand-in, and remembers the first bad one; the verb then answers
-- args_bad(): {C.INVALID, 'name: why'}, before it has written anything.
local smatch, sfind, ssub, sformat, ltype =
  string.match, string.find, string.sub, string.format, type
local fmt = lib.meta.fmt

local ARG_BAD = false  -- per call: 'name: why' of the first bad argument, or false
local function arg_fail(name, why, v)
  if ARG_BAD then return end
  local shown = 'nothing'
  if v ~= nil then shown = sformat('%q', ssub(tostring(v), 1, 40)) end
  ARG_BAD = name .. ': ' .. why .. ', got ' .. shown
end

-- The answer of a verb whose arguments did not pass, or nil.
local function args_bad()
  if ARG_BAD then return {C.INVALID, ARG_BAD} end
  return nil
end

-- Exactly n arguments (no stray ones a caller believes were read).
local function arg_len(argv, n)
  if #argv ~= n then arg_fail('ARGV', 'expected ' .. n .. ' arguments', #argv) end
end

-- The optional last argument at position i: a connection's CLIENT ID (digits) or ''
-- (not known), then nothing more; returns the id or ''.
local function arg_opt_conn(argv, i)
  local v = argv[i]
  if v == nil then arg_len(argv, i - 1); return '' end
  arg_len(argv, i)
  if v ~= '' and (#v > 20 or not smatch(v, '^%d+$')) then
    arg_fail('conn id', 'not a connection id', v)
    return ''
  end
  return v
end

-- (The checks run on every call of the hot verbs, ~65 k instructions of an ack's ~800 k
-- before they were made cheaper, bench/HISTORY.md: patterns with find, not match, which
-- makes a string of the match; a checked string of digits converted by arithmetic, one
-- strtod, where tonumber makes two; a class scan anchored, not tried at every position.)

-- An integer (decimal digits, an optional minus sign) in [lo, hi].
local function arg_int(v, name, lo, hi)
  -- (the counts and flags most calls send, compared as interned strings: no pattern)
  if v == '1' and lo <= 1 and hi >= 1 then return 1 end
  if v == '0' and lo <= 0 and hi >= 0 then return 0 end
  if v == '-1' and lo <= -1 and hi >= -1 then return -1 end
  if ltype(v) ~= 'string' or #v > 20 or not sfind(v, '^%-?%d+$') then
    arg_fail(name, 'not an integer', v)
    return lo
  end
  local n = v + 0
  if n < lo or n > hi then
    arg_fail(name, 'not in [' .. fmt(lo) .. ', ' .. fmt(hi) .. ']', v)
    return lo
  end
  return n
end

-- A task id: a canonical integer in [0, 2^32 - 1] (a bit offset of the done bitmap),
-- kept as the string (it names hash fields).
local function arg_task(v, name)
  -- the common case in one pattern: canonical, at most 10 digits, within 2^32 - 1
  if ltype(v) == 'string' and #v <= 10 and (v == '0' or sfind(v, '^[1-9]%d*$'))
      and (#v < 10 or v + 0 <= 4294967295) then
    return v
  end
  arg_int(v, name, 0, 4294967295)
  -- canonical: no sign, no leading zero (a pattern, not a formatting of the number)
  if not ARG_BAD and v ~= '0' and not sfind(v, '^[1-9]%d*$') then
    arg_fail(name, 'not a canonical task id', v)
  end
  return v
end

-- A lease token: digits only, compared as the string.
local function arg_token(v, name)
  if ltype(v) ~= 'string' or #v > 20 or not sfind(v, '^%d+$') then
    arg_fail(name, 'not a token', v)
  end
  return v
end

-- An id written into '|'-separated records (worker, incarnation, host): at most 200
-- bytes, no '|' and no control characters; empty only when `empty_ok`.
local function arg_id(v, name, empty_ok)
  if ltype(v) ~= 'string' then arg_fail(name, 'missing', v); return '' end
  if v == '' and not empty_ok then arg_fail(name, 'empty', v); return '' end
  if #v > 200 then arg_fail(name, 'longer than 200 bytes', v); return '' end
  if not sfind(v, '^[^|%c]*$') then
    arg_fail(name, "contains '|' or a control character", v)
  end
  return v
end

-- Any string (free text) of at most `max` bytes.
local function arg_text(v, name, max)
  if ltype(v) ~= 'string' then arg_fail(name, 'missing', v); return '' end
  if #v > max then arg_fail(name, 'longer than ' .. max .. ' bytes', v); return '' end
  return v
end

-- One of the words of `choices` (a space-separated list).
local function arg_enum(v, name, choices)
  if ltype(v) ~= 'string' or not sfind(' ' .. choices .. ' ', ' ' .. v .. ' ', 1, true) then
    arg_fail(name, 'not one of ' .. choices, v)
    return ''
  end
  return v
end

-- A count n at argv[pos] in [0, max] followed by n (task, token) pairs; returns n.
local function arg_pairs(argv, pos, name, max)
  local n = arg_int(argv[pos], name, 0, max)
  if ARG_BAD then return 0 end
  if #argv < pos + 2 * n then arg_fail(name, 'more pairs than given', argv[pos]); return 0 end
  for k = 1, n do
    arg_task(argv[pos + 2 * k - 1], name .. ' task')
    arg_token(argv[pos + 2 * k], name .. ' token')
  end
  return n
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  ARG_BAD = false
end

return {arg_fail = arg_fail, args_bad = args_bad, arg_len = arg_len, arg_opt_conn = arg_opt_conn,
  arg_int = arg_int, arg_task = arg_task, arg_token = arg_token, arg_id = arg_id,
  arg_text = arg_text, arg_enum = arg_enum, arg_pairs = arg_pairs, reset = reset}
