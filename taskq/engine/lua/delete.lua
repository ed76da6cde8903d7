#!lua flags=allow-oom
-- delete: remove every key of the job (UNLINK: O(1) here, freed in the background): those
-- job_keys() names and a mixed job's stored sequence, the blocks of each kept pass up to its
-- charged reach, read from its state (lib/mix.lua drop_all: a few UNLINKs, lib/mixseq.lua).
-- It only frees, so it runs out of memory too (allow-oom): the operator's way out.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any)
-- returns: {code}
local rcall, unpk = redis.call, unpack
local arg_id, arg_len, args_bad = lib.args.arg_id, lib.args.arg_len, lib.args.args_bad
local mget, drop_all = lib.meta.mget, lib.mix.drop_all
arg_id(ARGV[1], 'job_inc', true)
arg_len(ARGV, 1)
local bad = args_bad()
if bad then return bad end
local cur = rcall('HGET', K_META, N.INC)
if not cur or (ARGV[1] ~= '' and ARGV[1] ~= cur) then return {C.JOB_NOT_FOUND} end
if mget(F.SHUFFLE) == 'm' then drop_all() end
rcall('UNLINK', unpk(job_keys()))
return {C.OK}
