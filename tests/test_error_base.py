"""One error base for every user-facing error (frontend/diagnostics.py SparsileError): code,
message, span and help, one constructor, one rendering; codes come from the registry."""

from __future__ import annotations

import pytest

import sparsile as sp
from sparsile.backend.runtime import CudaError
from sparsile.frontend.codes import CODES
from sparsile.frontend.diagnostics import (
    CompileError,
    Diagnostic,
    LaunchError,
    Severity,
    SparsileError,
    set_construction_hook,
)
from sparsile.frontend.layout.layouts import LayoutError, log2_exact
from sparsile.frontend.spans import UNKNOWN_SPAN, SourceFile, Span
from sparsile.stdlib.blockscale import BlockScaleError
from sparsile.stdlib.sparsity.errors import SparsityError


@pytest.mark.parametrize("cls", [LaunchError, LayoutError, SparsityError])
def test_every_error_class_shares_the_base_constructor_and_rendering(cls):
    e = cls("SP0724", "malformed signature item `x`", "write name=type")
    assert isinstance(e, SparsileError) and isinstance(e, sp.SparsileError)
    assert (e.code, e.message, e.help, e.span) == ("SP0724", "malformed signature item `x`", "write name=type",
                                                  UNKNOWN_SPAN)
    assert str(e) == "error[SP0724]: malformed signature item `x`\n = help: write name=type"
    assert str(cls("SP0401", "no help")) == "error[SP0401]: no help"


def test_python_bases_are_kept():
    assert issubclass(LayoutError, ValueError) and issubclass(SparsityError, ValueError)
    assert issubclass(BlockScaleError, SparsityError) and issubclass(CudaError, LaunchError)
    with pytest.raises(ValueError, match=r"error\[SP0401\]: size must be a positive power of two, found 3"):
        log2_exact(3)


def test_an_error_becomes_a_located_diagnostic():
    source = SourceFile("k.spk", "x = 1\n")
    span = Span(source, 1, 1, 1, 2)
    e = LayoutError("SP0401", "size must be a positive power of two", "use 2**n", span=span)
    assert e.to_diagnostic() == Diagnostic("SP0401", "size must be a positive power of two", span, help="use 2**n")
    moved = e.to_compile_error(UNKNOWN_SPAN)
    assert isinstance(moved, CompileError) and moved.codes == ["SP0401"] and moved.span is UNKNOWN_SPAN


def test_a_compile_error_answers_with_its_first_error():
    warn = Diagnostic("SP0110", "a warning first", severity=Severity.WARNING)
    err = Diagnostic("SP0201", "undefined name `y`", help="define `y`")
    e = CompileError([warn, err])
    assert isinstance(e, SparsileError) and isinstance(e, sp.SparsileError)
    assert (e.code, e.message, e.help) == ("SP0201", "undefined name `y`", "define `y`")
    assert str(e) == warn.render() + "\n\n" + err.render()
    assert CompileError([]).code == ""


def test_a_diagnostic_without_a_source_location_has_no_empty_gutter_line():
    """No span (a target name, a Python argument): the message, then the note and help lines; an empty
    ``  |`` gutter line stood between them, with no source excerpt to close. With a span it stays, under
    the excerpt."""
    diag = Diagnostic("SP0601", "unknown target `hopper`", help="did you mean `sm_90a`?", notes=("a note",))
    assert diag.render().splitlines() == ["error[SP0601]: unknown target `hopper`", "  = note: a note",
                                          "  = help: did you mean `sm_90a`?"]
    assert str(CompileError([diag, Diagnostic("SP0602", "second")])).splitlines()[3:] == [
        "", "error[SP0602]: second", "", "error: aborting due to 2 previous errors"]
    located = Diagnostic("SP0201", "undefined name `y`", Span(SourceFile("k.spk", "x = y\n"), 1, 5, 1, 6),
                         help="define `y`")
    assert located.render().splitlines() == ["error[SP0201]: undefined name `y`", " --> k.spk:1:5", "  |",
                                             "1 | x = y", "  |     ^", "  |", "  = help: define `y`"]


def test_the_codes_of_the_error_classes_are_registered():
    assert {"SP0401", "SP0724", "SP0801", "SP0715"} <= set(CODES)
    assert all(code.startswith("SP0") and len(code) == 6 and title for code, title in CODES.items())


def test_a_construction_hook_sees_each_error_first_and_may_refuse_it():
    """``set_construction_hook`` (sparsile.torch's, for torch.compile: integrations/torch/traced_errors.py): the
    hook gets the error's type, code, message and help before it is built; what it raises is raised instead."""
    seen = []

    def hook(error_type, code, message, help):
        seen.append((error_type, code, message, help))
        if code == "SP0402":
            raise KeyError("refused")

    previous = set_construction_hook(hook)
    try:
        e = LayoutError("SP0401", "size must be a positive power of two", "use 2**n")
        assert e.span is UNKNOWN_SPAN
        assert str(e) == "error[SP0401]: size must be a positive power of two\n = help: use 2**n"
        with pytest.raises(KeyError, match="refused"):
            SparsityError("SP0402", "another")
    finally:
        assert set_construction_hook(previous) is hook
    assert seen == [(LayoutError, "SP0401", "size must be a positive power of two", "use 2**n"),
                    (SparsityError, "SP0402", "another", None)]
    LayoutError("SP0401", "no hook now")
    assert len(seen) == 2
