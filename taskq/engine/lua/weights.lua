#!lua
-- weights: a mixed job's weights from a slot on (docs/mixing.md, "Weights change at a
-- stated slot"): logged in the job's weight log; the slot is the one asked for when it is
-- not charged yet, else the first slot not charged. Leases in flight are untouched.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), weights (one per source, in the sources' order, ',' between:
--       decimal numbers >= 0, one > 0), at (-1: the first slot not charged)
-- returns: {code, slot}
local smatch, sgmatch, tonum = string.match, string.gmatch, tonumber
local mget = lib.meta.mget
local arg_fail, arg_id, arg_int, arg_len, arg_text, args_bad =
  lib.args.arg_fail, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.arg_text,
  lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local mix_flush, mix_set, spec = lib.mix.mix_flush, lib.mix.mix_set, lib.mix.spec
arg_id(ARGV[1], 'job_inc', true)
local text = arg_text(ARGV[2], 'weights', 65536)
local at = arg_int(ARGV[3], 'at', -1, 9007199254740991)
arg_len(ARGV, 3)
local ws, any = {}, false
for w in sgmatch(text, '[^,]+') do
  if not smatch(w, '^%d+%.?%d*$') and not smatch(w, '^%d+%.?%d*[eE][-+]?%d+$') then
    arg_fail('weights', 'not a decimal number', w)
  elseif tonum(w) >= 1e300 then
    arg_fail('weights', 'too large', w)
  elseif tonum(w) > 0 then
    any = true
  end
  ws[#ws + 1] = w
end
if not any then arg_fail('weights', 'none above 0', text) end
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err, 0}) end
if mget(F.SHUFFLE) ~= 'm' then return done({C.INVALID, 'not a mixed job'}) end
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED, 0}) end
if #ws ~= #spec().n then
  return done({C.INVALID, 'weights: ' .. #ws .. ' given, the job mixes ' .. #spec().n .. ' sources'})
end
local slot = mix_set(ws, at)
mix_flush()
event('mix_weights', 'slot', slot, 'weights', text)
return done({C.OK, slot})
