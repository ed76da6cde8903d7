-- mixrule.lua: a mixed job's deadline rule (docs/mixing.md, "Slots and the schedule"), the
-- choice of a slot's source in O(log k) for lib/mix.lua's charge (taskq/mix.py
-- `pass_schedule` is the reference: a scan of every source, the same comparisons).
local lipairs, mceil, tremove = ipairs, math.ceil, table.remove

-- A segment's weights (the logged ones `wn` over the sources not run out;
-- when only sources of weight 0 are left, equal shares of them), the sources with a share
-- in order, and the rule's d.
local function segment(t, n, wn)
  local k = #n
  local w, act, sum, left = {}, {}, 0, 0
  for i = 1, k do
    if t[i] < n[i] then
      left = left + 1
      if wn[i] > 0 then sum = sum + wn[i] end
    end
  end
  for i = 1, k do
    w[i] = 0
    if t[i] < n[i] then
      local wi = wn[i]
      if sum > 0 then
        if wi > 0 then w[i] = wi / sum; act[#act + 1] = i end
      else
        w[i] = 1 / left; act[#act + 1] = i
      end
    end
  end
  local d = 0
  if #act >= 2 then d = 1 - 1 / (2 * #act - 2) end
  return act, w, d
end

-- The deadline rule's choice among a segment's sources in O(log k) a slot: a source is
-- *due* at segment position m when c + 1 - d <= w * m (the comparison the linear rule
-- makes, so the same floats decide); the rule takes the due source of the smallest
-- deadline (c + d) / w, the lowest index on a tie, else (none due) the smallest deadline
-- of all. The due ones are a binary heap on (deadline, index); the others wait in
-- buckets by the first m at which they are due (an integer: w * m grows with m).
local function before(dl, a, b)
  local x, y = dl[a], dl[b]
  return x < y or (x == y and a < b)
end

local function heap_push(hp, dl, i)
  local j = #hp + 1
  hp[j] = i
  while j > 1 do
    local up = (j - j % 2) / 2
    if not before(dl, hp[j], hp[up]) then break end
    hp[j], hp[up] = hp[up], hp[j]
    j = up
  end
end

local function heap_pop(hp, dl)
  local top, n = hp[1], #hp
  hp[1] = hp[n]
  hp[n] = nil  -- (after: with n = 1 the two are one slot)
  n = n - 1
  local j = 1
  while true do
    local l = 2 * j
    if l > n then break end
    if l < n and before(dl, hp[l + 1], hp[l]) then l = l + 1 end
    if not before(dl, hp[l], hp[j]) then break end
    hp[j], hp[l] = hp[l], hp[j]
    j = l
  end
  return top
end

-- The first segment position m >= 1 at which a source with c tasks in the segment is due.
local function due_at(c, w, d)
  local lhs = c + 1 - d
  local m = mceil(lhs / w)
  if m >= 4503599627370496 then return m end  -- (a share so small it is never due)
  if m < 1 then m = 1 end
  while m > 1 and lhs <= w * (m - 1) do m = m - 1 end
  while lhs > w * m do m = m + 1 end
  return m
end

-- The choice's structure for the segment's sources `act` from segment position m on.
local function choice(act, c, w, d, m)
  local ch = {hp = {}, dl = {}, at = {}, wait = {}}
  for _, i in lipairs(act) do
    ch.dl[i] = (c[i] + d) / w[i]
    local at = due_at(c[i], w[i], d)
    if at <= m then
      heap_push(ch.hp, ch.dl, i)
    else
      ch.at[i] = at
      local b = ch.wait[at]
      if b then b[#b + 1] = i else ch.wait[at] = {i} end
    end
  end
  return ch
end

-- The source the rule takes at segment position m (taken out of the structure).
local function choose(ch, act, m)
  local b = ch.wait[m]
  if b then
    for _, i in lipairs(b) do ch.at[i] = nil; heap_push(ch.hp, ch.dl, i) end
    ch.wait[m] = nil
  end
  if #ch.hp > 0 then return heap_pop(ch.hp, ch.dl) end
  local best = nil  -- none due: the smallest deadline of all (all wait)
  for _, i in lipairs(act) do
    if not best or before(ch.dl, i, best) then best = i end
  end
  local wb = ch.wait[ch.at[best]]
  for j = 1, #wb do
    if wb[j] == best then tremove(wb, j); break end
  end
  ch.at[best] = nil
  return best
end

-- Source `i`, charged at segment position m (c tasks in the segment now), back into the
-- structure.
local function settle(ch, i, c, w, d, m)
  ch.dl[i] = (c + d) / w
  local at = due_at(c, w, d)
  if at <= m + 1 then
    heap_push(ch.hp, ch.dl, i)
  else
    ch.at[i] = at
    local b = ch.wait[at]
    if b then b[#b + 1] = i else ch.wait[at] = {i} end
  end
end

return {segment = segment, choice = choice, choose = choose, settle = settle}
