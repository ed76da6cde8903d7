-- progress.lua: how far into its task each holder got (the progress hash, this pass
-- attempt), where a lease starts reading, and the checkpoints' records and pages.
-- Semantics (what is recorded, what the audit counts as re-read): docs/resume.md.

-- Fills each granted row's start (element 6): the samples the task's earlier holders of
-- this pass attempt recorded as taken; a row starting past 0 counts as resumed.
local function add_starts(out, granted)
  if progress_empty() then
    for _, g in lipairs(out) do g[6] = 0 end
    return
  end
  local got = rcall('HMGET', K_PROGRESS, unpk(granted))
  for k, g in lipairs(out) do
    local start = tonum(got[k] or '0') or 0
    g[6] = start
    if start > 0 then
      mincr(F.P_RESUMED)
      mincr(F.P_RESUMED_S, start)
    end
  end
end

-- The bytes of the done bitmap one checkpoint page holds (8 x as many tasks), and the
-- most (task, value) pairs in one page of a checkpoint's unfinished tasks.
local CK_PAGE_BYTES, CK_PAGE_PAIRS = 65536, 2000  -- per call

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
    for k = 0, (rec.ppages or 0) - 1 do fields[#fields + 1] = id .. ':p:' .. k end
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
