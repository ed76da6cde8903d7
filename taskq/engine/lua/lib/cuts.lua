-- cuts.lua: a checkpoint's records and pages (checkpoint.lua takes the cut; rewind.lua
-- restores it and derives the rest: its writes stay in that admin verb, so the trainers'
-- ACL rule needs none of its commands).
-- A checkpoint's pages, fields of the ckpt hash: '<id>:d:<k>' done bitmap, '<id>:x:<k>'
-- dead bitmap (CK_PAGE_BYTES each), '<id>:p:<k>' progress ('task:samples,...').
local rcall, smatch, unpk, ltype = redis.call, string.match, unpack, type
local arg_fail = lib.args.arg_fail

-- (CK_PAGE_BYTES: the bytes of a bitmap one checkpoint page holds, 8 x as many tasks;
-- CK_PAGE_PAIRS: the most (task, samples) pairs in one page of its progress; both
-- constants of contract.py, written into the library as numbers by library.py)

local function ck_record(id)
  local raw = rcall('HGET', K_CKPT, id)
  if not raw then return nil end
  return cjson.decode(raw)
end

-- Removes every field of checkpoint `id` (its record names its pages).
local function ck_drop(id)
  local rec = ck_record(id)
  local fields = {id}
  if rec then
    for k = 0, (rec.pages or 0) - 1 do fields[#fields + 1] = id .. ':d:' .. k end
    for k = 0, (rec.xpages or 0) - 1 do fields[#fields + 1] = id .. ':x:' .. k end
    for k = 0, (rec.ppages or 0) - 1 do fields[#fields + 1] = id .. ':p:' .. k end
    if (rec.policy or 0) > 0 then fields[#fields + 1] = id .. ':policy' end
  end
  rcall('HDEL', K_CKPT, unpk(fields))
  rcall('ZREM', K_CKPTS, id)
end

-- A checkpoint id (lib/args.lua's idiom): 1-64 of [A-Za-z0-9._-], so never the ':' that
-- separates it from its page in the checkpoint hash's field names.
local function arg_ckpt(v, name)
  if ltype(v) ~= 'string' or #v < 1 or #v > 64 or not smatch(v, '^[A-Za-z0-9._-]+$') then
    arg_fail(name, 'not 1-64 of A-Z a-z 0-9 . _ -', v)
    return ''
  end
  return v
end

return {ck_record = ck_record, ck_drop = ck_drop, arg_ckpt = arg_ckpt}
