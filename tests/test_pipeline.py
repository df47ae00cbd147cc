"""The compile pipeline as one list of named stages (driver/compiler.py PIPELINE) and the program
dumps after any stage: ``SPARSILE_DUMP_AFTER`` and ``sparsile compile --dump-after``."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

import sparsile as sp
from sparsile.cli import EXIT_OK, EXIT_USAGE, main
from sparsile.driver import cache as cache_mod
from sparsile.driver.compiler import PIPELINE, STAGE_NAMES, compile_kernel
from sparsile.frontend.dump import ENV_DUMP_AFTER, dumping

ROOT = Path(sp.__file__).resolve().parent
VECTOR_ADD = ROOT / "examples" / "vector_add.spk"
HEADER = re.compile(r"^// ---- after (\w+): (\S+) ----$", re.M)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "cache"))
    cache_mod.reset_default_cache()
    yield
    cache_mod.reset_default_cache()


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), stdout=out, stderr=err), out.getvalue(), err.getvalue()


def test_the_pipeline_lists_every_stage_from_text_to_cubin_once():
    assert STAGE_NAMES == ("parse", "build", "specialize", "sema", "layout", "legality", "llvm", "ptx", "cubin")
    for stage in PIPELINE:
        assert (ROOT / stage.where).is_file(), stage
        assert stage.does


def test_cli_dumps_after_every_stage_in_pipeline_order(fresh_cache, tmp_path):
    code, _, err = run_cli("compile", str(VECTOR_ADD), "--kernel", "vector_add", "--emit", "cubin",
                             "--target", "sm_90a", "--dump-after", "parse,build", "--dump-after",
                             ",".join(STAGE_NAMES[2:]), "-o", str(tmp_path / "k.cubin"))
    assert code == EXIT_OK, err
    headers = HEADER.findall(err)
    assert [stage for stage, _ in headers] == list(STAGE_NAMES)
    assert headers[0][1].endswith("vector_add.spk") and {k for _, k in headers[2:]} == {"vector_add"}
    sections = dict(zip((s for s, _ in headers), HEADER.split(err)[3::3], strict=True))
    assert sections["parse"].startswith("\nmodule\n") and "FunctionDef" in sections["build"]
    assert "BLOCK = " in sections["specialize"]
    assert "#L[" not in sections["sema"] and "#L[" in sections["layout"]  # layouts appear at inference
    assert "define ptx_kernel void @vector_add" in sections["llvm"]
    assert ".entry vector_add" in sections["ptx"] and "bytes of ELF for sm_90a" in sections["cubin"]


def test_environment_variable_dumps_and_bypasses_the_cache(fresh_cache, monkeypatch, capsys):
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    compile_kernel(kernel, None, target="sm_90a", stop_after="ptx")  # now in the cache
    capsys.readouterr()
    monkeypatch.setenv(ENV_DUMP_AFTER, "legality, ptx")
    compile_kernel(kernel, None, target="sm_90a", stop_after="ptx")
    assert [s for s, _ in HEADER.findall(capsys.readouterr().err)] == ["legality", "ptx"]


def test_no_dump_unless_asked(fresh_cache, monkeypatch, capsys):
    monkeypatch.delenv(ENV_DUMP_AFTER, raising=False)
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    compile_kernel(kernel, None, target="sm_90a", stop_after="llvm", cache=False)
    assert "// ---- after" not in capsys.readouterr().err


def test_dumping_overrides_the_environment(fresh_cache, monkeypatch):
    monkeypatch.setenv(ENV_DUMP_AFTER, "llvm")
    stream = io.StringIO()
    with dumping(["sema"], stream):
        sp.load(VECTOR_ADD).kernels["vector_add"].compile(None, target="sm_90a", stop_after="ir")
    assert [s for s, _ in HEADER.findall(stream.getvalue())] == ["sema"]


def test_an_unknown_stage_is_refused_by_the_cli_and_warned_about_in_the_environment(fresh_cache, monkeypatch):
    code, _, err = run_cli("compile", str(VECTOR_ADD), "--kernel", "vector_add", "--dump-after", "lowering")
    assert code == EXIT_USAGE
    assert err.startswith("error: --dump-after: no stage named 'lowering'; the stages are parse, build,")
    monkeypatch.setenv(ENV_DUMP_AFTER, "sema,lowering")
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    with pytest.warns(UserWarning, match="SPARSILE_DUMP_AFTER: no stage named lowering; the stages are parse"):
        compile_kernel(kernel, None, target="sm_90a", stop_after="ir", cache=False)


def test_the_architecture_page_shows_the_pipeline_as_the_code_lists_it():
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| `([\w/.]+)` \|$", page, re.M)
    assert rows == [(stage.name, stage.where) for stage in PIPELINE]
