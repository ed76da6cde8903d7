-- mixdead.lua: a mixed job's dead copies as its slots see them (docs/mixing.md, "Dead
-- copies"): what dies is the copy (K_MIXDEAD, lib/endings.lua make_dead), and a charged
-- page's slot of a dead copy is dead at once (lib/mix.lua charge_page, mix_set's cut).
local rcall, lipairs, unpack = redis.call, ipairs, unpack

-- The slots a page charged whose copies are dead (`out`: the copy ids of positions
-- `pos0`..) are dead at once, as any dead task of the pass: one EXISTS a page, one
-- SMISMEMBER when some copy is dead (docs/mixing.md, "Dead copies").
local function mark_dead(pos0, out)
  if rcall('EXISTS', K_MIXDEAD) == 0 then return end
  for i, v in lipairs(rcall('SMISMEMBER', K_MIXDEAD, unpack(out))) do
    if v == 1 then
      local task = pos0 + i - 1
      rcall('SADD', K_DEAD, task)
      rcall('SETBIT', K_DEADBITS, task, 1)
      CALL.DEAD_EMPTY = false
    end
  end
end

-- Positions `from` .. `to` - 1 of the current pass charged again (a weight change's cut):
-- those dead for their copy are not dead any more (no position past what was handed out
-- is dead for another reason); the charge that reaches them marks them again.
local function unmark_dead(from, to)
  if to <= from or rcall('EXISTS', K_DEAD) == 0 then return end
  local pos = {}
  for h = from, to - 1 do pos[#pos + 1] = h end
  for i, v in lipairs(rcall('SMISMEMBER', K_DEAD, unpack(pos))) do
    if v == 1 then
      rcall('SREM', K_DEAD, pos[i])
      rcall('SETBIT', K_DEADBITS, pos[i], 0)
    end
  end
end

return {mark_dead = mark_dead, unmark_dead = unmark_dead}
