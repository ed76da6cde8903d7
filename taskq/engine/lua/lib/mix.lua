-- mix.lua: a mixed job's slots (docs/mixing.md). The engine's task of a mixed job is the
-- *slot*: position k of pass p (slot p * N + k), its pass order the identity. Its sources'
-- tasks are copied at create into the job's chunks hash, each under its *copy id*
-- (source s, 0-based, task j of that source: s * 2^32 + j, the field 10 hex digits), so a
-- source can gain tasks without renumbering any and a copy may be the task of any number
-- of slots (on_exhausted=cycle: a source's j-th slot over the job's life takes its task
-- j mod n). The schedule says which copy each slot is: a pure function of the sources'
-- sizes and the weight log (taskq/mix.py `pass_schedule` is the same rule in Python); a
-- slot once charged keeps its copy for good (the sequence is stored, so a rewind, a pass
-- reset or a re-dispatch never changes which copy a slot is), and a weight change holds
-- from a slot not yet handed out. A lease resolves its slots' chunks through the stored
-- sequence (lib/mixslot.lua). Slots are charged a page (PAGE positions) ahead of the
-- leases: meta 'mixh' is the slot the stored sequence of the state's pass ends before (hot:
-- a lease below it charges nothing), 'mixd' the slot no lease reached yet as of the
-- cursor's last move back or to another pass (mix_note; between, the cursor: mix_charged);
-- zset 'mixahead' the state's pass's positions granted at or past the cursor (a dead slot
-- retried, leased from the front: lib/mixslot.lua handed), handed out past the cursor's reach.
-- Keys (cold; their fields: docs/design.md's table of keys): 'mix' hash, the schedule's
-- state at its high-water ("s": one struct-packed string, read and written once a page:
-- lib/mixrule.lua state_format; "s0" the same at the last page's start; ":<p>" as pass p
-- was left); 'mixsz' the copies' sizes in samples when the weights count them (a hash:
-- field "<source>:<block>", '>I4' each for the source's tasks 256 * block ..); 'mixlog'
-- "<slot>|<seq, 12 digits>|<w,w,...>" scored by slot (the last wins); the sequence: lib/mixseq.lua.
local rcall, tonum, smatch, ssub, sformat, tconcat, lipairs =
  redis.call, tonumber, string.match, string.sub, string.format, table.concat, ipairs
local fmt, mget, mnum, mput = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.mput
local mmax, mmin, unpack, mark_dead, unmark_dead =
  math.max, math.min, unpack, lib.mixdead.mark_dead, lib.mixdead.unmark_dead
local segment, choice, choose, settle, choose_by_samples, cycle_task, on_last =
  lib.mixrule.segment, lib.mixrule.choice, lib.mixrule.choose, lib.mixrule.settle,
  lib.mixrule.choose_by_samples, lib.mixrule.cycle_task, lib.mixrule.on_last
local unpack_rule_state, pack_state, sizes_reader, life_after, numbers =
  lib.mixrule.unpack_state, lib.mixrule.pack_state, lib.mixrule.sizes_reader,
  lib.mixrule.life_after, lib.mixrule.numbers
local feed_view, charge_stream = lib.mixfeed.feed_view, lib.mixfeed.charge_stream
local get_seq, set_seq, drop_seq = lib.mixseq.get, lib.mixseq.set, lib.mixseq.drop

local KEEP = 3  -- constant
-- Positions charged at once (a page: the state read and written, the tasks stored, once a
-- page; bench/mix.py). A weight change inside the page cuts it at its slot (mix_set).
local PAGE = 256  -- constant
local W = 10  -- constant: the width of a stored position (a copy id, 10 hex digits)
local STRIDE = 4294967296  -- constant: copy id = source (0-based) * STRIDE + its task

local SPEC = nil  -- per call: the decoded F.MIX {sources, n, w, on_exhausted}
local ST = nil  -- per call: the schedule's state, when read (false: none yet)
local ST_DIRTY = false  -- per call

local function spec()
  if not SPEC then SPEC = cjson.decode(mget(F.MIX)) end
  return SPEC
end

-- The weights in force at `slot` (the last logged at or below it; the create's if none),
-- as logged: "w,w,...".
local function weights_at(slot)
  local got = rcall('ZREVRANGEBYSCORE', kc('mixlog'), fmt(slot), '-inf', 'LIMIT', 0, 1)
  if #got > 0 then return smatch(got[1], '^[^|]*|[^|]*|(.*)$') end
  return tconcat(spec().w, ',')
end

-- The slot of the first logged change strictly after `slot` (-1: none).
local function next_change(slot)
  local got = rcall('ZRANGEBYSCORE', kc('mixlog'), '(' .. fmt(slot), '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  if #got > 0 then return tonum(got[2]) end
  return -1
end

local function by_samples()
  return spec().by == 'samples'
end

-- on_exhausted=cycle: no source runs out, its j-th slot over the job's life takes its task
-- j mod n (lib/mixrule.lua cycle_task).
local function cycling()
  return spec().on_exhausted == 'cycle'
end

-- Each source's first copy id (copy id = source * STRIDE + task: lib/mixrule.lua's rule
-- reads a source's next task as o[i] + t[i]).
local function store_offsets(st)
  for i = 1, #st.n do st.o[i] = (i - 1) * STRIDE end
  return st
end

local function unpack_state(blob, kp, sm)
  return store_offsets(unpack_rule_state(blob, kp, sm, spec().streams ~= nil))
end

local function read_state()
  if ST == nil then
    local r = rcall('HMGET', kc('mix'), 's', 's0', 'kp')
    if r[1] then
      ST = unpack_state(r[1], numbers(r[3] or ''), by_samples())
      ST.s0 = r[2]
    else
      ST = false
    end
  end
  return ST
end

-- Pass p's state before its first slot; `life` each source's slots over the job's life
-- before it (cycle; nil: none).
local function fresh_state(p, kp, life, view)
  local n, zero, k = spec().n, {}, #spec().n
  for i = 1, k do zero[i] = 0 end
  local start = p * mnum(F.N)
  local st = {p = p, h = 0, seg = 0, nx = next_change(start), rs = 1, kp = kp, n = n, sm = by_samples(),
    t = zero, c = {unpack(zero)}, w = numbers(weights_at(start)), l = life or {unpack(zero)},
    o = {}}
  store_offsets(st)
  if spec().streams then feed_view(spec(), st, start, view) end  -- (lib/mixfeed.lua)
  st.s0 = pack_state(st)
  return st
end

local FEED = {weights_at = weights_at, next_change = next_change}  -- constant: lib/mixfeed.lua's

local function is_kept(st, p)
  for _, q in lipairs(st.kp) do if q == p then return true end end
  return false
end

-- The state's fields as HSET arguments, each name with `sfx`.
local function state_args(st, sfx, args)
  args[#args + 1] = 's' .. sfx
  args[#args + 1] = pack_state(st)
  args[#args + 1] = 's0' .. sfx
  args[#args + 1] = st.s0
  return args
end

-- The saved state of pass p (kept) and its positions handed out, or nil.
local function saved_state(p, kp)
  local sfx = ':' .. fmt(p)
  local r = rcall('HMGET', kc('mix'), 's' .. sfx, 's0' .. sfx, 'd' .. sfx)
  if not r[1] then return nil end
  local st = unpack_state(r[1], kp, by_samples())
  st.s0 = r[2]
  return st, tonum(r[3] or '0')
end

-- Drops the sequence and the saved state of pass q: the sequence up to its charged reach
-- and a page past it (what a weight change's cut left stored there, mix_set).
local function drop_pass(q)
  local st, sfx = ST and ST.p == q and ST or saved_state(q, {}), ':' .. fmt(q)
  drop_seq(q, (st and st.h or 0) + PAGE)
  rcall('HDEL', kc('mix'), 's' .. sfx, 's0' .. sfx, 'd' .. sfx)
end

-- Pass p's state made current: its saved one when `kept` (a rewind back to it) or a new
-- one (`life`: fresh_state's); p joins the kept passes `keep`; the meta's high-waters
-- follow it.
local function enter(p, keep, kept, life, view)
  local base = p * mnum(F.N)
  local st, d = nil, 0
  if not is_kept({kp = keep}, p) then keep[#keep + 1] = p end
  if kept then st, d = saved_state(p, keep) end
  if st then
    st.nx, st.raw = next_change(base + st.h - 1), nil
    if st.fs then rcall('HDEL', kc('mix'), 'wait') end  -- (another pass's; fresh: feed_view)
  else
    st, d = fresh_state(p, keep, life, view), 0
    drop_seq(p, PAGE)  -- (an older pass's first page, if any is left: drop_pass took theirs)
  end
  mput(F.MIXH, base + st.h)
  mput(F.MIXD, base + d)
  rcall('ZREMRANGEBYSCORE', kc('mixahead'), '-inf', '+inf')  -- (the pass left's)
  mput(F.MIXE, st.rs == 2 and base + st.h or -1)
  ST, ST_DIRTY = st, true
  return st
end

-- The state of pass p made current: the one being left saved under ":<its pass>", the
-- one of p loaded (a rewind back to it) or made. Going to p keeps the sequences of p and the
-- KEEP - 1 passes before it; later passes' go (the log makes them again, with any change
-- set since), older ones too. (The pass being left handed out up to 'mixd', mix_note, and
-- the positions of 'mixahead'; its saved 'd' the first after both, mix_charged's.)
local function switch_to(p)
  local st = read_state()
  local kept, life, view = {}, nil, nil
  if st then
    if st.fs and p == st.p + 1 then view = st end
    local sfx = ':' .. fmt(st.p)
    local args = state_args(st, sfx, {})
    local d = mmin(st.h, mmax(0, mnum(F.MIXD) - st.p * mnum(F.N)))
    local ahead = rcall('ZRANGEBYSCORE', kc('mixahead'), fmt(d), '+inf')  -- (at most a page)
    args[#args + 1] = 'd' .. sfx
    args[#args + 1] = fmt(#ahead > 0 and mmin(st.h, mmax(d, tonum(ahead[#ahead]) + 1)) or d)
    rcall('HSET', kc('mix'), unpack(args))
    kept = st.kp
    if cycling() and p > st.p then  -- (the positions charged ahead, never handed out)
      local rest, from = {}, d
      for _, a in lipairs(ahead) do
        rest[#rest + 1], from = get_seq(st.p, from, mmin(tonum(a), st.h)), tonum(a) + 1
      end
      rest[#rest + 1] = get_seq(st.p, mmin(from, st.h), st.h)
      life = life_after(st, tconcat(rest), W)
    end
  end
  local keep = {}
  for _, q in lipairs(kept) do
    if q > p or q <= p - KEEP then drop_pass(q) elseif q ~= p then keep[#keep + 1] = q end
  end
  local was_kept = is_kept({kp = kept}, p)
  -- the log below the kept passes goes, but for the change in force at their start
  local cut = (p - KEEP + 1) * mnum(F.N)
  if cut > 0 then
    local last = rcall('ZREVRANGEBYSCORE', kc('mixlog'), fmt(cut), '-inf', 'WITHSCORES', 'LIMIT',
      0, 1)
    if #last > 0 then rcall('ZREMRANGEBYSCORE', kc('mixlog'), '-inf', '(' .. last[2]) end
    if spec().streams then lib.mixfeed.forget_below(cut) end  -- (its repaid slots)
  end
  return enter(p, keep, was_kept, life, view)
end

-- Charges the next page of the state's pass by the deadline rule (lib/mixrule.lua), stored
-- at once (lib/mixseq.lua). With `upto`, instead, the state is walked on to position `upto` by the
-- positions stored there (the rule not asked: a weight change's state at its slot, mix_set).
-- on_exhausted=stop: the charge ends after the slot where a source of positive weight takes
-- its last task (on_last); the state's rs is 2 then, meta 'mixe' the pass's end slot.
local function charge_page(st, upto)
  if st.rs == 2 then return end
  if st.fs then ST_DIRTY = true; return charge_stream(spec(), st, upto, FEED) end
  local nn = mnum(F.N)
  local base = st.p * nn
  local n, t, c, o, k = st.n, st.t, st.c, st.o, #st.n
  local h0 = st.h
  local last, kept = upto, nil
  if upto then
    kept = get_seq(st.p, h0, upto)
  else
    last = mmin(h0 + PAGE, nn)
    st.s0 = pack_state(st)
  end
  st.raw = nil
  local out, act, w, d, ch = {}, nil, nil, 0, nil
  local size_of, m_samples, sz = nil, 0, {}  -- (sz: choose_by_samples' next sizes)
  if by_samples() then
    size_of = sizes_reader(kc('mixsz'), STRIDE)
    for i = 1, k do m_samples = m_samples + c[i] end
  end
  -- per source, its next task (cycle: in its source pass, lib/mixrule.lua cycle_task)
  local rule, cyc, nt = spec().on_exhausted, cycling(), t
  if cyc then
    nt = {}
    for i = 1, k do nt[i] = cycle_task(st.l[i] + t[i], n[i]) end
  end
  for h = h0, last - 1 do
    local slot = base + h
    if st.nx >= 0 and slot >= st.nx then
      st.w = numbers(weights_at(slot))
      st.nx = next_change(slot)
      st.rs = 1
    end
    if st.rs == 1 then
      st.seg, st.rs, act, m_samples = h, 0, nil, 0
      for i = 1, k do c[i] = 0 end
    end
    local m = h - st.seg + 1
    local best
    if kept then
      local at = (h - h0) * W
      best = tonum(ssub(kept, at + 1, at + 2), 16) + 1
    elseif size_of then
      if not act then act, w = segment(t, n, st.w, cyc) end
      best = choose_by_samples(w, c, nt, o, size_of, m_samples, sz)
    else
      if not act then
        act, w, d = segment(t, n, st.w, cyc)
        ch = choice(act, c, w, d, m)
      end
      best = choose(ch, act, m)
    end
    local task = nt[best]
    local step = 1
    if size_of then  -- (sz forgets best's next size: its next task is another now)
      step, sz[best] = sz[best] or size_of(o[best] + task), nil; m_samples = m_samples + step
    end
    local tb, cb = t[best] + 1, c[best] + step
    t[best], c[best] = tb, cb
    if cyc then nt[best] = cycle_task(st.l[best] + tb, n[best]) end
    if tb >= n[best] and on_last(rule, st.w[best]) then
      st.rs = on_last(rule, st.w[best]) == 'stop' and 2 or 1  -- (drop: the others renormalise)
    elseif ch then
      settle(ch, best, cb, w[best], d, m)
    end
    if not kept then out[#out + 1] = sformat('%010x', o[best] + task) end
    if st.rs == 2 then last = h + 1; break end  -- (stop: the pass ends after this slot)
  end
  st.h = last
  mput(F.MIXH, base + last)
  if st.rs == 2 then mput(F.MIXE, base + last) end
  ST_DIRTY = true
  if not kept then
    set_seq(st.p, h0, tconcat(out))
    if #out > 0 then mark_dead(h0, out) end
  end
end

-- The first position of pass p after those handed out (its sequence's length; 0 when not
-- kept): the cursor's reach in the current pass, 'mixd' as of the cursor's last move back,
-- and past the last position granted ahead of it ('mixahead').
local function mix_charged(p)
  local st = read_state()
  if not st then return 0 end
  local d = 0
  if st.p == p then
    local top = rcall('ZRANGE', kc('mixahead'), -1, -1)
    d = mmax(0, mmin(st.h, mmax(mnum(F.MIXD) - p * mnum(F.N), (tonum(top[1]) or -1) + 1)))
  elseif is_kept(st, p) then
    d = select(2, saved_state(p, st.kp)) or 0
  elseif p ~= mnum(F.PASS) then
    return 0
  end
  if p == mnum(F.PASS) then d = mmax(d, mnum(F.CURSOR)) end
  return d
end

-- The slot from which weights set now hold: `at` (-1: none) or, if handed out already, the
-- first slot not handed out. The change is logged and the state learns of it: a page
-- charged past `at` is cut there (the state at `at` made again from the page's start by the
-- positions stored before it: at most a page). Sequences of passes after the current one
-- (left by a rewind to an earlier pass) go: the log makes them again, with this change.
local function mix_set(ws, at)
  local p = mnum(F.PASS)
  local base = p * mnum(F.N)
  local first = base + mix_charged(p)
  if at < first then at = first end
  local st = read_state()
  if st then
    local keep = {}
    for _, q in lipairs(st.kp) do
      if q > p then drop_pass(q) else keep[#keep + 1] = q end
    end
    st.kp, ST_DIRTY = keep, true
    if st.p > p then enter(p, keep, is_kept(st, p)) end  -- (its sequence just went)
  end
  local seq = rcall('HINCRBY', kc('mix'), 'lseq', 1)
  -- (the last of a slot wins: one entry a slot, so the log is bounded by the slots kept)
  rcall('ZREMRANGEBYSCORE', kc('mixlog'), fmt(at), fmt(at))
  rcall('ZADD', kc('mixlog'), fmt(at), fmt(at) .. '|' .. sformat('%012d', seq) .. '|'
    .. tconcat(ws, ','))
  st = read_state()
  if st and st.p == p then
    if st.fs and at == base + st.h then rcall('HDEL', kc('mix'), 'wait') end  -- (a new pick)
    if at < base + st.h then
      -- charged ahead past `at`: the state at `at` made again from the page's start by
      -- the positions stored before `at` (the log below `at` is as it was), and those from
      -- `at` on dropped: the lease that reaches `at` charges them, with the change
      local back = unpack_state(st.s0, st.kp, by_samples())
      back.s0, back.nx, back.raw = st.s0, next_change(base + back.h - 1), nil
      ST = back
      local was = st.h
      charge_page(back, at - base)
      unmark_dead(at - base, was)
      if back.fs then lib.mixfeed.forget_from(at) end  -- (its charge logs them anew)
      if st.rs == 2 then mput(F.MIXE, -1) end  -- (the stop, past `at`, is charged again)
    elseif st.h == 0 and at == base then  -- (nothing charged: from the start, fresh_state's)
      st.w, st.nx, st.rs, st.raw = numbers(tconcat(ws, ',')), next_change(at), 1, nil
    elseif st.nx < 0 or at < st.nx then
      st.nx, st.raw = at, nil
    end
    ST_DIRTY = true
  end
  return at
end

-- This call's writes of the state (dispatch, after its cursor walk).
local function mix_flush()
  if not ST_DIRTY then return end
  local kp = {}
  for i, q in lipairs(ST.kp) do kp[i] = fmt(q) end
  local args = state_args(ST, '', {})
  args[#args + 1] = 'kp'
  args[#args + 1] = tconcat(kp, ',')
  rcall('HSET', kc('mix'), unpack(args))
  ST_DIRTY = false
end

-- Every kept pass's sequence dropped (delete, a create over the job: job_keys() names none).
local function drop_all()
  for _, q in lipairs(read_state() and ST.kp or {}) do drop_pass(q) end
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  SPEC, ST, ST_DIRTY = nil, nil, false
end

return {mix_charged = mix_charged, mix_set = mix_set, is_kept = is_kept, saved_state = saved_state,
  mix_flush = mix_flush, spec = spec, reset = reset,
  read_state = read_state, switch_to = switch_to, charge_page = charge_page, drop_all = drop_all}
