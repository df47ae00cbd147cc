"""The LLVM IR of the native ``sparsile_call`` CUDA handler (:mod:`.native` explains what it does).

``{NAME}`` placeholders are byte offsets of XLA's call-frame structs and the address of the handler's
global state (an int64 array: cuLaunchKernel, cuLaunchKernelEx, the Python handler, the plan table,
its mask, the fast / slow / launch-failure counters, cuTensorMapEncodeTiled); :class:`.native.NativeHandler` fills them
in before compiling. A record is an int64 array (header words as in :mod:`.native`).
"""

HANDLER_IR = r"""
define internal ptr @buffer_data(ptr %frame, i64 %src) {
entry:
  %is_arg = icmp sge i64 %src, 0
  br i1 %is_arg, label %arg, label %ret
arg:
  %an_p = getelementptr i8, ptr %frame, i64 {ARGS_N}
  %an = load i64, ptr %an_p
  %ai_p = getelementptr i8, ptr %frame, i64 {ARGS_ITEMS}
  %ai = load ptr, ptr %ai_p
  br label %pick
ret:
  %rn_p = getelementptr i8, ptr %frame, i64 {RETS_N}
  %rn = load i64, ptr %rn_p
  %ri_p = getelementptr i8, ptr %frame, i64 {RETS_ITEMS}
  %ri = load ptr, ptr %ri_p
  %rj = sub i64 -1, %src
  br label %pick
pick:
  %n = phi i64 [%an, %arg], [%rn, %ret]
  %items = phi ptr [%ai, %arg], [%ri, %ret]
  %k = phi i64 [%src, %arg], [%rj, %ret]
  %inside = icmp ult i64 %k, %n
  br i1 %inside, label %load, label %bad
load:
  %b_p = getelementptr ptr, ptr %items, i64 %k
  %b = load ptr, ptr %b_p
  %d_p = getelementptr i8, ptr %b, i64 {DATA}
  %d = load ptr, ptr %d_p
  ret ptr %d
bad:
  ret ptr inttoptr (i64 -1 to ptr)
}

define ptr @sparsile_cuda_handler(ptr %frame) {
entry:
  %sg = alloca [4 x i64], align 8
  %cfg = alloca [8 x i64], align 8
  %og_args = alloca [4 x i64], align 8
  %state = inttoptr i64 {STATE} to ptr
  %ext_p = getelementptr i8, ptr %frame, i64 {EXT}
  %ext = load ptr, ptr %ext_p
  %has_ext = icmp ne ptr %ext, null
  br i1 %has_ext, label %ext_type, label %stage
ext_type:
  %et_p = getelementptr i8, ptr %ext, i64 {EXT_TYPE}
  %et = load i32, ptr %et_p
  %metadata = icmp eq i32 %et, {METADATA}
  br i1 %metadata, label %slow, label %stage
stage:
  %stage_p = getelementptr i8, ptr %frame, i64 {STAGE}
  %st = load i32, ptr %stage_p
  %execute = icmp eq i32 %st, {EXECUTE}
  br i1 %execute, label %attrs, label %slow
attrs:
  %an_p = getelementptr i8, ptr %frame, i64 {ATTR_N}
  %an = load i64, ptr %an_p
  %names_p = getelementptr i8, ptr %frame, i64 {ATTR_NAMES}
  %names = load ptr, ptr %names_p
  %vals_p = getelementptr i8, ptr %frame, i64 {ATTR_VALS}
  %vals = load ptr, ptr %vals_p
  br label %aloop
aloop:
  %i = phi i64 [0, %attrs], [%i_next, %anext]
  %more = icmp slt i64 %i, %an
  br i1 %more, label %abody, label %slow
abody:
  %span_p = getelementptr ptr, ptr %names, i64 %i
  %span = load ptr, ptr %span_p
  %sptr = load ptr, ptr %span
  %slen_p = getelementptr i8, ptr %span, i64 8
  %slen = load i64, ptr %slen_p
  %len_ok = icmp eq i64 %slen, 13
  br i1 %len_ok, label %compare, label %anext
compare:
  %w0 = load i64, ptr %sptr, align 1
  %p5 = getelementptr i8, ptr %sptr, i64 5
  %w1 = load i64, ptr %p5, align 1
  %e0 = icmp eq i64 %w0, {NAME0}
  %e1 = icmp eq i64 %w1, {NAME1}
  %both = and i1 %e0, %e1
  br i1 %both, label %found, label %anext
anext:
  %i_next = add i64 %i, 1
  br label %aloop
found:
  %scalar_p = getelementptr ptr, ptr %vals, i64 %i
  %scalar = load ptr, ptr %scalar_p
  %value_pp = getelementptr i8, ptr %scalar, i64 {SCALAR_VALUE}
  %value_p = load ptr, ptr %value_pp
  %id = load i64, ptr %value_p
  %table_p = getelementptr i64, ptr %state, i64 3
  %table = load ptr, ptr %table_p
  %mask_p = getelementptr i64, ptr %state, i64 4
  %mask = load i64, ptr %mask_p
  %id_ok = icmp sgt i64 %id, 0
  %h0 = and i64 %id, %mask
  br i1 %id_ok, label %probe, label %slow
probe:
  %h = phi i64 [%h0, %found], [%h_next, %pnext]
  %tries = phi i64 [0, %found], [%tries_next, %pnext]
  %h2 = shl i64 %h, 1
  %entry_p = getelementptr i64, ptr %table, i64 %h2
  %key = load atomic i64, ptr %entry_p acquire, align 8
  %hit = icmp eq i64 %key, %id
  br i1 %hit, label %have, label %pmiss
pmiss:
  %empty = icmp eq i64 %key, 0
  br i1 %empty, label %slow, label %pnext
pnext:
  %h_inc = add i64 %h, 1
  %h_next = and i64 %h_inc, %mask
  %tries_next = add i64 %tries, 1
  %exhausted = icmp ugt i64 %tries_next, %mask
  br i1 %exhausted, label %slow, label %probe
have:
  %rec_pp = getelementptr i64, ptr %entry_p, i64 1
  %rec = load atomic ptr, ptr %rec_pp acquire, align 8
  %no_rec = icmp eq ptr %rec, null
  br i1 %no_rec, label %slow, label %armed_check
armed_check:
  %armed = load i64, ptr %rec
  %is_armed = icmp eq i64 %armed, 1
  br i1 %is_armed, label %stream, label %slow
stream:
  store i64 {SG_SIZE}, ptr %sg
  %sg_ext = getelementptr i8, ptr %sg, i64 8
  store i64 0, ptr %sg_ext
  %ctx_p = getelementptr i8, ptr %frame, i64 {CTX}
  %ctx = load i64, ptr %ctx_p
  %sg_ctx = getelementptr i8, ptr %sg, i64 {SG_CTX}
  store i64 %ctx, ptr %sg_ctx
  %sg_stream = getelementptr i8, ptr %sg, i64 {SG_STREAM}
  store i64 0, ptr %sg_stream
  %api_p = getelementptr i8, ptr %frame, i64 {API}
  %api = load ptr, ptr %api_p
  %get_p = getelementptr i8, ptr %api, i64 {STREAM_GET}
  %get = load ptr, ptr %get_p
  %sg_err = call ptr %get(ptr %sg)
  %sg_failed = icmp ne ptr %sg_err, null
  br i1 %sg_failed, label %slow, label %ordinal
ordinal:
  %api_size = load i64, ptr %api
  %has_og = icmp uge i64 %api_size, {ORD_END}
  %og_p = getelementptr i8, ptr %api, i64 {ORDINAL_GET}
  br i1 %has_og, label %ordinal_fn, label %device
ordinal_fn:
  %og = load ptr, ptr %og_p
  %og_null = icmp eq ptr %og, null
  br i1 %og_null, label %device, label %ordinal_call
ordinal_call:
  store i64 {OG_SIZE}, ptr %og_args
  %og_ext = getelementptr i8, ptr %og_args, i64 8
  store i64 0, ptr %og_ext
  %og_ctx = getelementptr i8, ptr %og_args, i64 {OG_CTX}
  store i64 %ctx, ptr %og_ctx
  %og_out = getelementptr i8, ptr %og_args, i64 {OG_ORDINAL}
  store i32 0, ptr %og_out
  %og_err = call ptr %og(ptr %og_args)
  %og_failed = icmp ne ptr %og_err, null
  %got_ordinal = load i32, ptr %og_out
  br i1 %og_failed, label %slow, label %device
device:
  %ord = phi i32 [0, %ordinal], [0, %ordinal_fn], [%got_ordinal, %ordinal_call]
  %ord64 = sext i32 %ord to i64
  %rord_p = getelementptr i64, ptr %rec, i64 15
  %rord = load i64, ptr %rord_p
  %same_device = icmp eq i64 %ord64, %rord
  br i1 %same_device, label %params, label %slow
params:
  %strm = load ptr, ptr %sg_stream
  %np_p = getelementptr i64, ptr %rec, i64 9
  %np = load i64, ptr %np_p
  %nbytes_p = getelementptr i64, ptr %rec, i64 10
  %nbytes = load i64, ptr %nbytes_p
  %nptr_p = getelementptr i64, ptr %rec, i64 11
  %nptr = load i64, ptr %nptr_p
  %nchk_p = getelementptr i64, ptr %rec, i64 12
  %nchk = load i64, ptr %nchk_p
  %ptr_base = add i64 16, %np
  %nptr3 = mul i64 %nptr, 3
  %chk_base = add i64 %ptr_base, %nptr3
  %nchk25 = mul i64 %nchk, 25
  %tpl_base = add i64 %chk_base, %nchk25
  %tpl = getelementptr i64, ptr %rec, i64 %tpl_base
  %nwords = lshr i64 %nbytes, 3
  %buf = alloca i64, i64 %nwords, align 64
  %ptrs = alloca ptr, i64 %np, align 8
  br label %copy
copy:
  %w = phi i64 [0, %params], [%w_next, %copy_body]
  %copy_more = icmp ult i64 %w, %nwords
  br i1 %copy_more, label %copy_body, label %pointers
copy_body:
  %src_w = getelementptr i64, ptr %tpl, i64 %w
  %word = load i64, ptr %src_w
  %dst_w = getelementptr i64, ptr %buf, i64 %w
  store i64 %word, ptr %dst_w
  %w_next = add i64 %w, 1
  br label %copy
pointers:
  %j = phi i64 [0, %copy], [%j_next, %ptr_body]
  %ptr_more = icmp ult i64 %j, %nptr
  br i1 %ptr_more, label %ptr_body, label %checks
ptr_body:
  %j3 = mul i64 %j, 3
  %pe = add i64 %ptr_base, %j3
  %psrc_p = getelementptr i64, ptr %rec, i64 %pe
  %psrc = load i64, ptr %psrc_p
  %poff_p = getelementptr i64, ptr %psrc_p, i64 1
  %poff = load i64, ptr %poff_p
  %pmask_p = getelementptr i64, ptr %psrc_p, i64 2
  %pmask = load i64, ptr %pmask_p
  %pdata = call ptr @buffer_data(ptr %frame, i64 %psrc)
  %pslot = getelementptr i8, ptr %buf, i64 %poff
  store ptr %pdata, ptr %pslot, align 8
  %j_next = add i64 %j, 1
  %pdata_i = ptrtoint ptr %pdata to i64
  %p_low = and i64 %pdata_i, %pmask
  %p_misaligned = icmp ne i64 %p_low, 0
  %p_missing = icmp eq i64 %pdata_i, -1
  %p_bad = or i1 %p_misaligned, %p_missing
  br i1 %p_bad, label %slow, label %pointers
checks:
  %q = phi i64 [0, %pointers], [%q_next, %chk_body], [%q_next, %encode]
  %chk_more = icmp ult i64 %q, %nchk
  br i1 %chk_more, label %chk_body, label %array
chk_body:
  %q25 = mul i64 %q, 25
  %ce = add i64 %chk_base, %q25
  %tm = getelementptr i64, ptr %rec, i64 %ce
  %csrc = load i64, ptr %tm
  %cdata = call ptr @buffer_data(ptr %frame, i64 %csrc)
  %cdata_i = ptrtoint ptr %cdata to i64
  %q_next = add i64 %q, 1
  %cached_p = getelementptr i64, ptr %tm, i64 24
  %cached = load i64, ptr %cached_p
  %same = icmp eq i64 %cdata_i, %cached
  br i1 %same, label %checks, label %reencode
reencode:
  %low = and i64 %cdata_i, 15
  %aligned = icmp eq i64 %low, 0
  br i1 %aligned, label %encode, label %slow
encode:
  %enc_p = getelementptr i64, ptr %state, i64 8
  %enc = load ptr, ptr %enc_p
  %toff_p = getelementptr i64, ptr %tm, i64 1
  %toff = load i64, ptr %toff_p
  %tslot = getelementptr i8, ptr %buf, i64 %toff
  %tdt_p = getelementptr i64, ptr %tm, i64 2
  %tdt = load i32, ptr %tdt_p
  %trank_p = getelementptr i64, ptr %tm, i64 3
  %trank = load i32, ptr %trank_p
  %til_p = getelementptr i64, ptr %tm, i64 4
  %til = load i32, ptr %til_p
  %tsw_p = getelementptr i64, ptr %tm, i64 5
  %tsw = load i32, ptr %tsw_p
  %tl2_p = getelementptr i64, ptr %tm, i64 6
  %tl2 = load i32, ptr %tl2_p
  %toob_p = getelementptr i64, ptr %tm, i64 7
  %toob = load i32, ptr %toob_p
  %tdims = getelementptr i64, ptr %tm, i64 8
  %tstrides = getelementptr i64, ptr %tm, i64 13
  %tbox = getelementptr i64, ptr %tm, i64 18
  %testr = getelementptr i64, ptr %tm, i64 21
  %enc_err = call i32 %enc(ptr %tslot, i32 %tdt, i32 %trank, ptr %cdata, ptr %tdims,
                            ptr %tstrides, ptr %tbox, ptr %testr, i32 %til, i32 %tsw, i32 %tl2, i32 %toob)
  %enc_ok = icmp eq i32 %enc_err, 0
  br i1 %enc_ok, label %checks, label %slow
array:
  %k = phi i64 [0, %checks], [%k_next, %arr_body]
  %arr_more = icmp ult i64 %k, %np
  br i1 %arr_more, label %arr_body, label %launch
arr_body:
  %ko = add i64 16, %k
  %off_p = getelementptr i64, ptr %rec, i64 %ko
  %off = load i64, ptr %off_p
  %slot = getelementptr i8, ptr %buf, i64 %off
  %arr_k = getelementptr ptr, ptr %ptrs, i64 %k
  store ptr %slot, ptr %arr_k
  %k_next = add i64 %k, 1
  br label %array
launch:
  %fn_p = getelementptr i64, ptr %rec, i64 1
  %fn = load ptr, ptr %fn_p
  %gx_p = getelementptr i64, ptr %rec, i64 2
  %gx = load i32, ptr %gx_p
  %gy_p = getelementptr i64, ptr %rec, i64 3
  %gy = load i32, ptr %gy_p
  %gz_p = getelementptr i64, ptr %rec, i64 4
  %gz = load i32, ptr %gz_p
  %bx_p = getelementptr i64, ptr %rec, i64 5
  %bx = load i32, ptr %bx_p
  %by_p = getelementptr i64, ptr %rec, i64 6
  %by = load i32, ptr %by_p
  %bz_p = getelementptr i64, ptr %rec, i64 7
  %bz = load i32, ptr %bz_p
  %sh_p = getelementptr i64, ptr %rec, i64 8
  %sh = load i32, ptr %sh_p
  %at_p = getelementptr i64, ptr %rec, i64 13
  %at = load ptr, ptr %at_p
  %plain = icmp eq ptr %at, null
  br i1 %plain, label %launch_plain, label %launch_ex
launch_plain:
  %lk = load ptr, ptr %state
  %err_plain = call i32 %lk(ptr %fn, i32 %gx, i32 %gy, i32 %gz, i32 %bx, i32 %by, i32 %bz,
                             i32 %sh, ptr %strm, ptr %ptrs, ptr null)
  br label %launched
launch_ex:
  store i32 %gx, ptr %cfg
  %c1 = getelementptr i32, ptr %cfg, i64 1
  store i32 %gy, ptr %c1
  %c2 = getelementptr i32, ptr %cfg, i64 2
  store i32 %gz, ptr %c2
  %c3 = getelementptr i32, ptr %cfg, i64 3
  store i32 %bx, ptr %c3
  %c4 = getelementptr i32, ptr %cfg, i64 4
  store i32 %by, ptr %c4
  %c5 = getelementptr i32, ptr %cfg, i64 5
  store i32 %bz, ptr %c5
  %c6 = getelementptr i32, ptr %cfg, i64 6
  store i32 %sh, ptr %c6
  %cs = getelementptr i8, ptr %cfg, i64 {CFG_STREAM}
  store ptr %strm, ptr %cs
  %ca = getelementptr i8, ptr %cfg, i64 {CFG_ATTRS}
  store ptr %at, ptr %ca
  %cn = getelementptr i8, ptr %cfg, i64 {CFG_NATTRS}
  store i32 1, ptr %cn
  %lkx_p = getelementptr i64, ptr %state, i64 1
  %lkx = load ptr, ptr %lkx_p
  %err_ex = call i32 %lkx(ptr %cfg, ptr %fn, ptr %ptrs, ptr null)
  br label %launched
launched:
  %err = phi i32 [%err_plain, %launch_plain], [%err_ex, %launch_ex]
  %ok = icmp eq i32 %err, 0
  br i1 %ok, label %done, label %failed
done:
  %fast_p = getelementptr i64, ptr %state, i64 5
  %f_old = atomicrmw add ptr %fast_p, i64 1 monotonic
  ret ptr null
failed:
  %err64 = zext i32 %err to i64
  %rerr_p = getelementptr i64, ptr %rec, i64 14
  store atomic i64 %err64, ptr %rerr_p monotonic, align 8
  %fails_p = getelementptr i64, ptr %state, i64 7
  %x_old = atomicrmw add ptr %fails_p, i64 1 monotonic
  br label %slow
slow:
  %slows_p = getelementptr i64, ptr %state, i64 6
  %s_old = atomicrmw add ptr %slows_p, i64 1 monotonic
  %slow_fn_p = getelementptr i64, ptr %state, i64 2
  %slow_fn = load ptr, ptr %slow_fn_p
  %result = call ptr %slow_fn(ptr %frame)
  ret ptr %result
}

define void @sparsile_publish(ptr %entry_p, i64 %key, i64 %rec) {
entry:
  ; the record's words were written before this call: release stores order them before the
  ; address, and the address before the key, for a handler reading with acquire loads on another
  ; core (needed on weakly ordered CPUs such as aarch64; free on x86-64)
  %rec_p = getelementptr i64, ptr %entry_p, i64 1
  store atomic i64 %rec, ptr %rec_p release, align 8
  store atomic i64 %key, ptr %entry_p release, align 8
  ret void
}
"""
