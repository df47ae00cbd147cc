"""Ill-typed and malformed kernels: each must raise CompileError (never another exception) whose
first diagnostic has the expected code, starts at the expected line and column, and says the
expected words (in its message or its help line).

Most rows are kernel bodies: :func:`kernel` puts ``@kernel`` on line 1, ``def k(PARAMS):`` on
line 2 and the body from line 3, indented by four spaces (so a body line's column is 5 + its
offset). Rows with ``FULL`` give a whole module. Constexpr parameters take their values from the
row's ``consts``.
"""

from __future__ import annotations

import textwrap

import pytest

from sparsile.driver.module import loads
from sparsile.frontend.diagnostics import CompileError, Severity

FULL = "full"


def kernel(body: str, params: str = "out: ptr[f32], n: i32") -> str:
    lines = textwrap.dedent(body).strip("\n").split("\n")
    return "@kernel\ndef k(" + params + "):\n" + "\n".join("    " + ln for ln in lines) + "\n"


HELPER_F = """\
def f(x, y=1):
    return x + y


"""  # two lines of helper, then two blank lines: the kernel starts on line 5

P = "out: ptr[f32], n: i32"
PB = "out: ptr[f32], n: i32, B: constexpr"

# (id, source, consts, code, line, col, fragment)
CASES: list[tuple[str, str, dict, str, int, int, str]] = [
    # ---------------------------------------------------------------- SP02xx: names and scopes
    ("unknown_name", kernel("x = undefined_thing + 1"), {}, "SP0202", 3, 9, "unknown name `undefined_thing`"),
    ("unknown_name_suggests", kernel("offs = arange(0, 16)\nstore(out + ofs, 1.0)"), {},
     "SP0202", 4, 17, "did you mean `offs`?"),
    ("range_outside_for", kernel("x = range(3)"), {}, "SP0202", 3, 9, "iterable of a `for` loop"),
    ("break", kernel("for i in range(n):\n    break"), {}, "SP0203", 4, 9, "`break` is not supported"),
    ("continue", kernel("for i in range(n):\n    continue"), {}, "SP0203", 4, 9, "`continue` is not supported"),
    ("value_attribute", kernel("x = arange(0, 16)\ny = x.frobnicate()"), {}, "SP0204", 4, 11,
     "has no attribute `frobnicate`"),
    ("dtype_attribute", kernel("y = f32.nonsense"), {}, "SP0204", 3, 13, "has no attribute `nonsense`"),
    ("namespace_member", FULL + "import sparsile as sp\n\n@kernel\ndef k(out: ptr[f32]):\n    sp.frobnicate(0)\n",
     {}, "SP0204", 5, 8, "`sparsile` has no member `frobnicate`"),
    ("recursion", FULL + "def f(x):\n    return f(x)\n\n@kernel\ndef k(out: ptr[f32]):\n    y = f(1)\n", {},
     "SP0205", 2, 12, "recursion is not supported"),
    ("kernel_returns_value", kernel("return 1"), {}, "SP0207", 3, 5, "a kernel cannot return a value"),
    ("import_in_kernel", kernel("import math"), {}, "SP0209", 3, 5, "imports are not allowed inside a kernel"),
    ("decorated_nested_def", kernel("@kernel\ndef twice(x):\n    return 2 * x\ny = twice(1)"), {}, "SP0206", 3, 6,
     "a decorator on `twice`, a function defined inside a kernel, has no effect"),
    ("assign_nothing", kernel("x = store(out, 1.0)"), {}, "SP0211", 3, 9, "returns nothing"),
    ("unpack_count", kernel("a, b = (1, 2, 3)"), {}, "SP0212", 3, 12, "expected 2 values to unpack, found 3"),
    ("unpack_tile", kernel("a, b = arange(0, 16)"), {}, "SP0212", 3, 12, "cannot unpack"),
    ("assign_element", kernel("x = arange(0, 16)\nx[0] = 1"), {}, "SP0213", 4, 5, "cannot be assigned"),
    ("assign_attribute", kernel("x = arange(0, 16)\nx.dtype = f16"), {}, "SP0213", 4, 5, "cannot be assigned"),
    ("if_on_tile", kernel("x = arange(0, 16)\nif x > 3:\n    pass"), {}, "SP0214", 4, 8,
     "condition must be a scalar"),
    ("if_on_builtin", kernel("if exp:\n    pass"), {}, "SP0214", 3, 8, "must be a value"),
    ("while_on_tile", kernel("x = arange(0, 16)\nwhile x < n:\n    x = x + 1"), {}, "SP0214", 4, 11,
     "condition must be a scalar"),
    ("helper_return_paths", FULL + "def f(x, n):\n    if n > 0:\n        return x\n    z = x\n\n"
     "@kernel\ndef k(out: ptr[f32], n: i32):\n    y = f(1.0, n)\n", {}, "SP0215", 2, 5,
     "every path of a helper must return a value"),
    ("branches_bind_functions", kernel("if n > 0:\n    g = exp\nelse:\n    g = log"), {}, "SP0216", 3, 5,
     "only numbers and tiles can differ"),
    ("branch_types_differ", kernel("if n > 0:\n    v = arange(0, 16)\nelse:\n    v = zeros((16,), f32)"), {},
     "SP0217", 3, 5, "in one branch and"),
    ("for_over_tuple", kernel("for i in (1, 2):\n    pass"), {}, "SP0218", 3, 14, "`range(...)` or `static_range"),
    ("for_over_call", kernel("for i in zip(n):\n    pass"), {}, "SP0218", 3, 14, "found `zip`"),
    ("for_over_a_local_range", kernel("for i in range(n):\n    pass\nrange = 3"), {}, "SP0218", 3, 14,
     "`range` is a local name of `k` (assigned in it), not the builtin"),
    ("for_over_a_local_static_range", kernel("static_range = 2\nfor i in static_range(4):\n    pass"), {}, "SP0218",
     4, 14, "`static_range` is a local name of `k`"),
    ("range_keyword", kernel("for i in range(n, step=2):\n    pass"), {}, "SP0219", 3, 23,
     "takes no keyword argument `step`"),
    ("range_arity", kernel("for i in range(1, 2, 3, 4):\n    pass"), {}, "SP0219", 3, 14, "takes 1 to 3 arguments"),
    ("loop_target_tuple", kernel("for i, j in range(n):\n    pass"), {}, "SP0220", 3, 9, "a single name"),
    ("static_step_zero", kernel("for i in static_range(0, 4, 0):\n    pass"), {}, "SP0221", 3, 33,
     "step of a loop cannot be zero"),
    ("runtime_step_zero", kernel("for i in range(0, n, 0):\n    pass"), {}, "SP0221", 3, 26,
     "step of a loop cannot be zero"),
    ("static_range_too_long", kernel("for i in static_range(5000):\n    pass"), {}, "SP0222", 3, 14,
     "would unroll 5000 iterations"),
    ("static_range_runtime_bound", kernel("for i in static_range(n):\n    pass"), {}, "SP0201", 3, 27,
     "bounds of `static_range` must be compile-time integers"),
    ("return_in_loop", kernel("for i in range(n):\n    return"), {}, "SP0223", 4, 9,
     "`return` inside a loop is not supported"),
    ("float_loop_bound", kernel("for i in range(0.5, n):\n    pass"), {}, "SP0224", 3, 20,
     "loop bounds must be integers"),
    ("tile_loop_bound", kernel("for i in range(arange(0, 16)):\n    pass"), {}, "SP0224", 3, 20,
     "loop bounds must be integer scalars"),
    ("tuple_carried", kernel("t = (1, 2)\nfor i in range(n):\n    t = (3, 4)"), {}, "SP0225", 4, 5,
     "is a tuple before the loop"),
    ("carried_type_changes", kernel("acc = zeros((16,), f16)\nfor i in range(n):\n"
                                    "    acc = acc + arange(0, 16).to(f32)"), {}, "SP0226", 4, 5,
     "enters the loop as tile<16xf16> and leaves an iteration as tile<16xf32>"),
    ("slice_outside_subscript", kernel("t = ptr[1:2]"), {}, "SP0227", 3, 13, "a slice is only allowed"),
    ("star_args", kernel("t = (1, 2)\nx = max(*t)"), {}, "SP0228", 4, 13, "`*args` is not supported"),
    ("double_star_kwargs", kernel("t = (1, 2)\nx = max(**t)"), {}, "SP0228", 4, 13, "`**kwargs` is not supported"),
    ("unbound_after_if", kernel("if n > 0:\n    v = 1.0\nstore(out, v)"), {}, "SP0237", 5, 16,
     "assigned in only one branch"),
    ("unbound_after_loop", kernel("for i in range(n):\n    w = 1.0\nstore(out, w)"), {}, "SP0237", 5, 16,
     "first assigned inside a run-time `for` loop"),
    ("loop_variable_after_loop", kernel("for i in range(n):\n    pass\nx = i + 1"), {}, "SP0237", 5, 9,
     "variable of a run-time `for` loop"),
    ("while_true", kernel("while True:\n    pass"), {}, "SP0238", 3, 11, "always true"),
    # ---------------------------------------------------------------- SP02xx: modules
    ("module_plain_names", FULL + "a.b = 3\n", {}, "SP0230", 1, 1, "module-level assignments bind plain names"),
    ("module_not_constant", FULL + "X = program_id(0)\n", {}, "SP0231", 1, 5, "compile-time constants"),
    ("module_unknown_import", FULL + "import numpy\n", {}, "SP0232", 1, 1, "unknown module `numpy`"),
    ("module_unknown_member", FULL + "from sparsile import nothing_here\n", {}, "SP0233", 1, 1,
     "has no member `nothing_here`"),
    ("module_statement", FULL + "for i in range(3):\n    pass\n", {}, "SP0234", 1, 1,
     "only functions, constants and imports"),
    ("unknown_decorator", FULL + "@foo\ndef k(out: ptr[f32]):\n    pass\n", {}, "SP0235", 1, 2, "unknown decorator"),
    ("decorator_positional", FULL + "@kernel(4)\ndef k(out: ptr[f32]):\n    pass\n", {}, "SP0235", 1, 9,
     "keyword arguments"),
    ("unknown_option", FULL + "@kernel(num_warpz=4)\ndef k(out: ptr[f32]):\n    pass\n", {}, "SP0236", 1, 9,
     "unknown kernel option `num_warpz`"),
    ("option_not_constant", FULL + "@kernel(num_warps=program_id(0))\ndef k(out: ptr[f32]):\n    pass\n", {},
     "SP0201", 1, 19, "must be a compile-time constant"),
    # ---------------------------------------------------------------- SP0201: constexpr required
    ("arange_runtime_end", kernel("x = arange(0, n)"), {}, "SP0201", 3, 19, "`end` of arange must be a compile-time"),
    ("zeros_runtime_shape", kernel("x = zeros((n,), f32)"), {}, "SP0201", 3, 15, "dimension of the shape"),
    ("program_id_runtime_axis", kernel("x = program_id(n)"), {}, "SP0201", 3, 20, "grid axis must be a compile-time"),
    ("constexpr_annotation", kernel("x: constexpr = n"), {}, "SP0201", 3, 20, "needs a compile-time value"),
    ("helper_constexpr_param", FULL + "def g(x, B: constexpr):\n    return x\n\n@kernel\n"
     "def k(out: ptr[f32], n: i32):\n    y = g(1, n)\n", {}, "SP0201", 6, 9, "is constexpr but received"),
    ("reduce_runtime_axis", kernel("x = sum(arange(0, 16), axis=n)"), {}, "SP0201", 3, 33,
     "reduction axis must be a compile-time"),
    # ---------------------------------------------------------------- SP03xx: types and shapes
    ("arange_not_power_of_two", kernel("x = arange(0, 10)"), {}, "SP0301", 3, 9, "must be a power of two, found 10"),
    ("zeros_not_power_of_two", kernel("x = zeros((3, 4), f32)"), {}, "SP0301", 3, 15, "powers of two, found 3"),
    ("shape_from_constexpr", kernel("x = zeros((B, 16), f32)", PB), {"B": 24}, "SP0301", 3, 15, "found 24"),
    ("ptr_bad_parameter", kernel("pass", "x: ptr[3]"), {}, "SP0302", 2, 10, "`ptr[...]` takes one scalar element type"),
    ("annotation_not_type", kernel("pass", "x: 3"), {}, "SP0302", 2, 10, "must be a type such as"),
    ("tensor_bad_rank", kernel("pass", "t: tensor[f16, 9]"), {}, "SP0302", 2, 10, "rank must be 1 to 5"),
    ("zeros_bad_dtype", kernel("x = zeros((16,), 3)"), {}, "SP0302", 3, 22, "must be a scalar type such as `f32`"),
    ("local_annotation_not_type", kernel("x: 3 = 4"), {}, "SP0302", 3, 8, "an annotation must be a type"),
    ("full_value_does_not_fit", kernel("x = full((16,), 300, i8)"), {}, "SP0303", 3, 21, "300 does not fit in i8"),
    ("literal_does_not_fit_u8", kernel("x = arange(0, 16).to(u8) + 256"), {}, "SP0303", 3, 32,
     "256 does not fit in u8"),
    ("literal_too_big", kernel("x = arange(0, 16).to(i64) + 10 ** 30"), {}, "SP0303", 3, 33, "does not fit"),
    ("inf_to_int", kernel('x = i32(float("inf"))'), {}, "SP0303", 3, 13, "has no value in i32"),
    ("store_string", kernel('store(out, "hello")'), {}, "SP0304", 3, 16, "expected a value"),
    ("broadcast_mismatch", kernel("x = arange(0, 16) + arange(0, 32)"), {}, "SP0305", 3, 9,
     "cannot broadcast shapes (16,) and (32,)"),
    ("broadcast_2d_mismatch", kernel("a = zeros((16, 8), f32)\nb = zeros((4, 16), f32)\nc = a * b"), {}, "SP0305",
     5, 9, "cannot broadcast shapes (16, 8) and (4, 16)"),
    ("store_shape_mismatch", kernel("store(out + arange(0, 16), zeros((32,), f32))"), {}, "SP0305", 3, 32,
     "cannot broadcast"),
    ("grid_axis", kernel("x = program_id(3)"), {}, "SP0306", 3, 20, "grid axis must be 0, 1 or 2"),
    ("full_tile_value", kernel("x = full((16,), arange(0, 16), f32)"), {}, "SP0307", 3, 21, "must be a scalar"),
    ("matmul_operator", kernel("x = arange(0, 16) @ arange(0, 16)"), {}, "SP0308", 3, 9, "use `dot(a, b, acc)`"),
    ("bitwise_on_float", kernel("x = arange(0, 16).to(f32) & 1"), {}, "SP0309", 3, 9, "needs integer operands"),
    ("invert_float", kernel("x = ~arange(0, 16).to(f32)"), {}, "SP0309", 3, 10, "needs an integer operand"),
    ("runtime_int_pow", kernel("x = arange(0, 16) ** 2"), {}, "SP0309", 3, 9, "`**` on run-time integers"),
    ("pointer_times", kernel("p = out * 2"), {}, "SP0310", 3, 9, "`*` is not defined on pointers"),
    ("pointer_plus_float", kernel("p = out + 1.5"), {}, "SP0310", 3, 15, "pointer offset must be an integer"),
    ("int_minus_pointer", kernel("p = 3 - out"), {}, "SP0310", 3, 9, "`-` is not defined on pointers"),
    ("math_on_pointer", kernel("x = exp(out)"), {}, "SP0311", 3, 13, "needs a numeric operand"),
    ("tanh_on_pointer", kernel("x = tanh(out + 1)"), {}, "SP0311", 3, 14, "`tanh` needs a numeric operand, found"),
    ("erf_on_pointer", kernel("x = 2.0 * erf(out)"), {}, "SP0311", 3, 19, "`erf` needs a numeric operand, found"),
    ("mask_not_bool", kernel("x = load(out + arange(0, 16), mask=arange(0, 16))"), {}, "SP0312", 3, 40,
     "a mask must be bool"),
    ("where_condition", kernel("x = where(arange(0, 16), 1.0, 2.0)"), {}, "SP0312", 3, 15,
     "condition of `where` must be bool"),
    ("to_on_pointer", kernel("q = out + arange(0, 16)\np = q.to(f32)"), {}, "SP0313", 4, 9,
     "pointers cannot be converted"),
    ("cdiv_float", kernel("x = cdiv(1.5, 2)"), {}, "SP0314", 3, 9, "cdiv needs integers"),
    ("load_non_pointer", kernel("x = load(arange(0, 16))"), {}, "SP0315", 3, 14, "expected a pointer"),
    ("other_without_mask", kernel("x = load(out + arange(0, 16), other=1.0)"), {}, "SP0316", 3, 41,
     "`other` has no effect without a `mask`"),
    ("reduce_scalar", kernel("x = sum(n)"), {}, "SP0317", 3, 13, "reduces a tile, found a scalar"),
    ("reduce_axis_range", kernel("x = sum(arange(0, 16), axis=1)"), {}, "SP0318", 3, 33, "axis 1 is out of range"),
    ("reshape_count", kernel("x = reshape(arange(0, 16), (4, 8))"), {}, "SP0319", 3, 32,
     "cannot reshape (16,) (16 elements) to (4, 8)"),
    ("permute_invalid", kernel("x = permute(zeros((4, 8), f32), (0, 0))"), {}, "SP0319", 3, 9,
     "is not a permutation"),
    ("static_assert_fails", kernel('static_assert(B > 64, "B too small")', PB), {"B": 32}, "SP0320", 3, 19,
     "static assertion failed: B too small"),
    ("assert_constant_false", kernel('assert 1 > 2, "nope"'), {}, "SP0320", 3, 12, "static assertion failed: nope"),
    ("builtin_missing_argument", kernel("x = arange(0)"), {}, "SP0321", 3, 9, "wrong arguments to `arange`"),
    ("builtin_unknown_keyword", kernel("x = arange(0, 16, step=2)"), {}, "SP0321", 3, 23,
     "wrong arguments to `arange`"),
    ("helper_too_many", FULL + HELPER_F + "@kernel\ndef k(out: ptr[f32]):\n    y = f(1, 2, 3)\n", {}, "SP0321", 7, 9,
     "takes 2 positional arguments but 3 were given"),
    ("helper_missing", FULL + HELPER_F + "@kernel\ndef k(out: ptr[f32]):\n    y = f()\n", {}, "SP0321", 7, 9,
     "missing the argument `x`"),
    ("helper_unknown_keyword", FULL + HELPER_F + "@kernel\ndef k(out: ptr[f32]):\n    y = f(1, z=2)\n", {},
     "SP0322", 7, 9, "has no parameter named `z`"),
    ("helper_twice", FULL + HELPER_F + "@kernel\ndef k(out: ptr[f32]):\n    y = f(1, x=2)\n", {}, "SP0323", 7, 9,
     "got two values for `x`"),
    ("scalar_type_call_arity", kernel("x = f32(1, 2)"), {}, "SP0321", 3, 9, "takes one argument"),
    ("const_op_undefined", kernel('x = "a" - 1'), {}, "SP0329", 3, 9, "is not defined between"),
    ("augassign_string", kernel('x = arange(0, 16)\nx += "a"'), {}, "SP0329", 4, 10, "needs numbers or tiles"),
    ("negate_string", kernel('x = -"a"'), {}, "SP0329", 3, 9, "is not defined on"),
    ("const_division_by_zero", kernel("x = 1 // 0"), {}, "SP0330", 3, 9, "division by zero"),
    ("const_modulo_by_zero", kernel("x = B % 0", PB), {"B": 4}, "SP0330", 3, 9, "division by zero"),
    ("len_of_runtime", kernel("x = len(n)"), {}, "SP0331", 3, 13, "works on compile-time values only"),
    ("max_of_empty", kernel("x = max(())"), {}, "SP0331", 3, 13, "failed on compile-time values"),
    ("in_on_runtime", kernel("x = n in (1, 2)"), {}, "SP0331", 3, 9, "works on compile-time values only"),
    ("call_a_number", kernel("x = 3(4)"), {}, "SP0332", 3, 9, "is not callable in a kernel"),
    ("call_a_value", kernel("x = n(1)"), {}, "SP0332", 3, 9, "is not callable in a kernel"),
    ("tuple_index_range", kernel("t = (1, 2)\nx = t[5]"), {}, "SP0333", 4, 11, "index 5 is out of range"),
    ("tuple_slice_step_zero", kernel("t = (1, 2)\nx = t[::0]"), {}, "SP0333", 4, 11, "step nonzero"),
    ("index_a_scalar_const", kernel("x = 3[0]"), {}, "SP0333", 3, 9, "cannot be indexed"),
    ("tile_element_index", kernel("x = arange(0, 16)\ny = x[3]"), {}, "SP0334", 4, 11,
     "can only be indexed with `:` and `None`"),
    ("too_many_tile_indices", kernel("x = arange(0, 16)\ny = x[:, :]"), {}, "SP0333", 4, 14, "too many indices"),
    ("dot_one_dimensional", kernel("a = zeros((16,), f16)\nc = dot(a, a)"), {}, "SP0335", 4, 13, "must be a 2-D tile"),
    ("dot_inner_dims", kernel("a = zeros((16, 32), f16)\nb = zeros((16, 16), f16)\nc = dot(a, b)"), {}, "SP0336",
     5, 16, "inner dimensions differ"),
    ("dot_mixed_types", kernel("a = zeros((16, 16), f16)\nb = zeros((16, 16), bf16)\nc = dot(a, b)"), {}, "SP0337",
     5, 16, "A is f16 but B is bf16"),
    ("dot_accumulator_shape", kernel("a = zeros((16, 16), f16)\nc = dot(a, a, zeros((16, 32), f32))"), {},
     "SP0338", 4, 19, "accumulator must be 16x16"),
    ("dot_accumulator_type", kernel("a = zeros((16, 16), bf16)\nc = dot(a, a, zeros((16, 16), f16))"), {},
     "SP0339", 4, 19, "bf16 operands accumulate in f32"),
    ("load_tile_not_tensor", kernel("x = load_tile(out, (0,), (16,))"), {}, "SP0342", 3, 19,
     "expected a global tensor"),
    ("load_tile_offsets", kernel("x = t.load_tile((0,), (16, 16))", "t: tensor[f32, 2]"), {}, "SP0343", 3, 21,
     "needs 2 offsets, found 1"),
    ("load_tile_shape_rank", kernel("x = t.load_tile((0, 0), (16,))", "t: tensor[f32, 2]"), {}, "SP0343", 3, 29,
     "needs a 2-D tile shape"),
    ("tile_too_large", kernel("x = zeros((1 << 21,), f32)"), {}, "SP0344", 3, 9, "the limit is 1048576"),
    ("broadcast_too_large", kernel("a = arange(0, 2048)\nb = a[:, None] + a[None, :]"), {}, "SP0344", 4, 9,
     "has 4194304 elements"),
    ("annotation_mismatch", kernel("x: ptr[f16] = out"), {}, "SP0345", 3, 19, "declared ptr[f16] but the value is"),
    ("constant_too_large", kernel("x = 2 ** 10 ** 9"), {}, "SP0346", 3, 9, "too large"),
    ("tuple_repeat_too_large", kernel("x = (1, 2) * 100000"), {}, "SP0346", 3, 9, "elements"),
]


def _first_error(source: str, consts: dict) -> CompileError:
    """Build the module and specialize kernel `k` from its annotations and ``consts``."""
    try:
        module = loads(source, "case.spk")
        k = module.kernels["k"]
        signature = {p.name: consts[p.name] if p.name in consts else p.annotation for p in k.params}
        bindings, key = k.signature_bindings(signature)
        k.ir_for(bindings, key)
    except CompileError as e:
        return e
    except Exception as e:  # a raw traceback is a bug: fail with its type
        pytest.fail(f"expected a CompileError, got {type(e).__name__}: {e}")
    pytest.fail("expected a CompileError, the program compiled")


def _source(src: str) -> str:
    return src[len(FULL):] if src.startswith(FULL) else src


@pytest.mark.parametrize(("source", "consts", "code", "line", "col", "fragment"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error(source: str, consts: dict, code: str, line: int, col: int, fragment: str) -> None:
    err = _first_error(_source(source), consts)
    errors = [d for d in err.diagnostics if d.severity is Severity.ERROR]
    d = errors[0]
    assert (d.code, d.span.line, d.span.col) == (code, line, col), d.render()
    assert fragment in d.message + " " + (d.help or ""), d.render()
    text = err.render()
    assert f"error[{code}]" in text and f"case.spk:{line}:{col}" in text and "Traceback" not in text


def test_corpus_is_large_and_ids_are_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 60


def test_several_errors_are_collected_in_source_order() -> None:
    src = kernel("""
    a = undefined_one
    b = arange(0, 10)
    c = a + b
    d = zeros((16,), f32) + arange(0, 32)
    store(out, undefined_two)
    """)
    err = _first_error(src, {})
    got = [(d.code, d.span.line) for d in err.diagnostics]
    # `c = a + b` uses two poisoned names and is not reported again.
    assert got == [("SP0202", 3), ("SP0301", 4), ("SP0305", 6), ("SP0202", 7)]
    assert "aborting due to 4 previous errors" in err.render()


def test_error_inside_helper_names_the_call() -> None:
    src = "def bad(x):\n    return x + nope\n\n@kernel\ndef k(out: ptr[f32]):\n    y = bad(1)\n    z = bad(2)\n"
    err = _first_error(src, {})
    assert len(err.diagnostics) == 1  # the same mistake reached from two calls is reported once
    d = err.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == ("SP0202", 2, 16)
    assert any("inlined at case.spk:6:9" in n for n in d.notes)


def test_unreachable_code_is_a_warning_not_an_error() -> None:
    module = loads(kernel("store(out, 1.0)\nreturn\nx = 1"), "case.spk")
    k = module.kernels["k"]
    bindings, key = k.signature_bindings({"out": k.params[0].annotation, "n": k.params[1].annotation})
    k.ir_for(bindings, key)  # compiles: SP0208 is a warning


def test_rendering_points_at_the_span() -> None:
    err = _first_error(kernel("x = arange(0, 16) + arange(0, 32)"), {})
    lines = err.render().splitlines()
    assert lines[0] == "error[SP0305]: cannot broadcast shapes (16,) and (32,)"
    assert lines[1].strip() == "--> case.spk:3:9"
    src_line = next(i for i, ln in enumerate(lines) if "x = arange(0, 16) + arange(0, 32)" in ln)
    caret = lines[src_line + 1]
    assert caret.index("^") == lines[src_line].index("arange(0, 16) +")
    assert caret.count("^") == len("arange(0, 16) + arange(0, 32)")
    assert any(ln.strip().startswith("= help:") for ln in lines)


def test_unrolling_and_inlining_have_a_budget(monkeypatch) -> None:
    from sparsile.frontend.sema import core as sema

    monkeypatch.setattr(sema, "MAX_STATEMENTS", 1000)
    src = kernel("a = 0\nfor i in static_range(100):\n    for j in static_range(100):\n        a += 1")
    err = _first_error(src, {})
    d = err.diagnostics[-1]
    assert (d.code, d.span.line, d.span.col) == ("SP0239", 6, 13)
    assert "more than 1000 statements" in d.message and "`range`" in (d.help or "")


def test_exponential_recursion_stops_at_the_first_report() -> None:
    import time

    src = ("def f(x):\n    a = f(x)\n    b = f(x)\n    return 1\n\n@kernel\ndef k(out: ptr[f32]):\n    y = f(1)\n")
    t0 = time.perf_counter()
    err = _first_error(src, {})
    assert err.codes == ["SP0205"] and time.perf_counter() - t0 < 5.0


def test_nested_loops_carrying_constants_compile_quickly() -> None:
    import time

    body = "acc = 0\n" + "".join("    " * i + f"for i{i} in range(n):\n" for i in range(16)) + "    " * 16 + "acc += 1"
    module = loads(kernel(body + "\nstore(out, acc)"), "case.spk")
    k = module.kernels["k"]
    t0 = time.perf_counter()
    k.ir_for(*k.signature_bindings({"out": k.params[0].annotation, "n": k.params[1].annotation}))
    assert time.perf_counter() - t0 < 5.0  # not exponential in the depth
