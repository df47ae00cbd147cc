"""The LLVM IR of the native ``sparsile_call`` CUDA handler (:mod:`.native` explains what it does).

``{NAME}`` placeholders are byte offsets of XLA's call-frame structs and the address of the handler's
global state (an int64 array: cuLaunchKernel, cuLaunchKernelEx, the Python handler, the plan table,
its mask, the fast / slow / launch-failure counters, cuTensorMapEncodeTiled); :class:`.native.NativeHandler` fills them
in before compiling. A record is an int64 array (header words as in :mod:`.native`). The record
launch itself, from the parameter copy to the launch's CUresult, is the shared core of
backend/runtime/native_launch.py (the torch launch record launches records with it too).
"""

from ...backend.runtime.native_launch import LAUNCH_CORE_IR

_BEFORE_LAUNCH = r"""
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
"""

_AFTER_LAUNCH = r"""done:
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

HANDLER_IR = _BEFORE_LAUNCH + LAUNCH_CORE_IR + _AFTER_LAUNCH
