"""The lazy import table of lowering modules (backend/lower/codegen.py) against what the modules register:
a kernel must never miss a lowering because its module was not imported."""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

from sparsile.backend.lower import codegen
from sparsile.frontend.ops.opdefs import OPS

ALL_MODULES = (*codegen.CORE_LOWERING_MODULES, *codegen.OPTIONAL_LOWERING_MODULES, "blackwell_tile")
IMPORTED_BY = {"blackwell_tile": "blackwell"}  # registered when its importer is loaded


def _registrations() -> list[tuple[str, str]]:
    """(op name, short module name) of every registered lowering, generic and target-specific."""
    for module in ALL_MODULES:
        importlib.import_module(f"sparsile.backend.lower.{module}")
    found = [(name, e.fn.__module__) for name, d in OPS.items() if isinstance(d.lowerings, list)
             for e in d.lowerings]
    return [(name, module.rsplit(".", 1)[-1]) for name, module in found]


def test_every_lowering_module_is_in_the_table():
    on_disk = {p.stem for p in pathlib.Path(codegen.__file__).parent.glob("*.py")}
    # no lowerings of their own
    helpers = {"__init__", "address_form", "codegen", "codegen_state", "deferred", "lane_exchange", "llvm_text",
               "hooks", "smem_access", "special_math", "reduce_fold", "tile_address", "wide_address"}
    assert on_disk - helpers == set(ALL_MODULES)


def test_every_registered_op_imports_its_module():
    registrations = _registrations()
    assert len(registrations) > 60
    for name, module in registrations:
        module = IMPORTED_BY.get(module, module)
        if module in codegen.CORE_LOWERING_MODULES:
            continue
        entries = codegen.OPTIONAL_LOWERING_MODULES[module]
        assert codegen._needs_module(name, entries), f"`{name}` is lowered in {module}, not imported for it"


def test_table_entries_match_registered_ops():
    """No stale entry: each name or prefix of the table matches an op its module registers."""
    registrations = _registrations()
    for module, entries in codegen.OPTIONAL_LOWERING_MODULES.items():
        owned = {name for name, m in registrations if IMPORTED_BY.get(m, m) == module}
        for entry in entries:
            assert any(codegen._needs_module(name, (entry,)) for name in owned), (module, entry)


def test_vector_add_compiles_without_the_target_specific_modules():
    code = (
        "import sys, sparsile\n"
        "from sparsile.driver.compiler import compile_kernel\n"
        "m = sparsile.load(sys.argv[1])\n"
        "ck = compile_kernel(m.kernels['vector_add'], 'x=ptr[f32], y=ptr[f32], out=ptr[f32], n=i32', "
        "target='sm_100a', stop_after='llvm')\n"
        "assert 'define ptx_kernel void @vector_add' in ck.llvm\n"
        "print(sorted(n for n in ('blackwell', 'cluster', 'mma', 'hopper') "
        "if 'sparsile.backend.lower.' + n in sys.modules))\n"
    )
    root = pathlib.Path(codegen.__file__).parents[2]
    out = subprocess.run([sys.executable, "-c", code, f"{root}/examples/vector_add.spk"], capture_output=True,
                         text=True, check=True, env={**os.environ, "SPARSILE_CACHE_DIR": "off"}).stdout
    assert out.strip().splitlines()[-1] == "['blackwell']"  # the sm_100a target hooks, nothing else


def test_non_ascii_kernel_and_parameter_names_compile():
    """Python identifiers may be non-ASCII, PTX ones may not: names are mangled (codegen.llvm_name)."""
    import sparsile

    src = (
        "@kernel\n"
        "def ké(é: ptr[f32], n: i32, BLOCK: constexpr = 128):\n"
        "    offs = program_id(0) * BLOCK + arange(0, BLOCK)\n"
        "    store(é + offs, load(é + offs, mask=offs < n) * 2.0, mask=offs < n)\n"
    )
    kernel = sparsile.loads(src).kernels["ké"]
    ck = kernel.compile("é=ptr[f32], n=i32", target="sm_90a")
    assert codegen.llvm_name("ké") == "k$u00e9"
    assert ".entry k$u00e9(" in ck.ptx
    assert b"k$u00e9" in ck.cubin
    assert codegen.llvm_name("vector_add") == "vector_add"
