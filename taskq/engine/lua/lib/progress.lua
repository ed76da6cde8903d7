-- progress.lua: how far into its task each holder got (the progress hash, this pass
-- attempt) and where a lease starts reading.
-- Semantics (what is recorded, what the audit counts as re-read): docs/resume.md.
local rcall, tonum, unpk, lipairs = redis.call, tonumber, unpack, ipairs
local mincr, mnum = lib.meta.mincr, lib.meta.mnum
local progress_empty = lib.leases.progress_empty
local split_rec = lib.pieces.split_rec

-- Fills each granted row's start (element 6): the samples the task's earlier holders of
-- this pass attempt recorded as taken; a row starting past 0 counts as resumed. A piece
-- of a split task also gets its end (element 7): a tail piece's row has both already
-- (split.lua: take_split), a head piece's ends at the split point.
local function add_starts(out, granted)
  local splits = mnum(F.P_BACKUPS) > 0
  -- (each row comes with its start slot 0: grant, take_backup)
  if progress_empty() and not splits then return end
  local got = rcall('HMGET', K_PROGRESS, unpk(granted))
  for k, g in lipairs(out) do
    if g[7] == nil then
      local start = tonum(got[k] or '0') or 0
      g[6] = start
      if start > 0 then
        mincr(F.P_RESUMED)
        mincr(F.P_RESUMED_S, start)
      end
      local s = splits and split_rec(granted[k])
      if s then g[7] = s.m end
    end
  end
end

return {add_starts = add_starts}
