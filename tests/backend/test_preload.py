"""The background load of libllvmlite and nvJitLink (backend/preload.py), in fresh interpreters so
that each test sees a process where nothing was loaded yet."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTOR_ADD = ROOT / "examples" / "vector_add.spk"


def _run(code: str, **env: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code, str(VECTOR_ADD)], capture_output=True, text=True,
                          env={**os.environ, "SPARSILE_CACHE_DIR": "off", **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


LOADED = (
    "import sys\n"
    "def mapped(name):\n"
    "    return any(name in line for line in open('/proc/self/maps'))\n"
)


def test_loading_a_module_preloads_llvm_and_nvjitlink():
    out = _run(LOADED + (
        "import sparsile\n"
        "from sparsile.backend import preload\n"
        "before = (mapped('libllvmlite'), mapped('libnvJitLink'))\n"
        "sparsile.load(sys.argv[1])\n"
        "preload.wait()\n"
        "print(before, (mapped('libllvmlite'), mapped('libnvJitLink')), preload.errors,\n"
        "      'llvmlite.binding' in sys.modules)\n"))
    assert out == "(False, False) (True, True) [] False"


def test_jit_decoration_starts_it_too(tmp_path):
    script = tmp_path / "kern.py"
    script.write_text(LOADED + (
        "import sparsile\n"
        "from sparsile.backend import preload\n"
        "@sparsile.jit\n"
        "def copy(x: sparsile.ptr[sparsile.f32], y: sparsile.ptr[sparsile.f32]):\n"
        "    offs = sparsile.arange(0, 128)\n"
        "    sparsile.store(y + offs, sparsile.load(x + offs))\n"
        "preload.wait()\n"
        "print(mapped('libllvmlite'), mapped('libnvJitLink'))\n"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SPARSILE_CACHE_DIR": "off"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True True"


def test_disabled_by_environment():
    out = _run(LOADED + (
        "import sparsile\n"
        "from sparsile.backend import preload\n"
        "sparsile.load(sys.argv[1])\n"
        "preload.wait()\n"
        "print(preload._thread is None, mapped('libllvmlite'), mapped('libnvJitLink'))\n"), SPARSILE_PRELOAD="0")
    assert out == "True False False"


def test_compile_after_preload_matches_compile_without():
    code = (
        "import sys, hashlib, sparsile\n"
        "k = sparsile.load(sys.argv[1]).kernels['vector_add']\n"
        "ck = k.compile('x=ptr[f32], y=ptr[f32], out=ptr[f32], n=i32', target='sm_90a')\n"
        "print(hashlib.sha256(ck.ptx.encode()).hexdigest(), hashlib.sha256(ck.cubin).hexdigest())\n")
    assert _run(code, SPARSILE_PRELOAD="1") == _run(code, SPARSILE_PRELOAD="0")


def test_fork_waits_for_the_thread():
    """Forked right after the thread starts, the child still finds both libraries loaded: the
    parent joined the thread before forking."""
    out = _run(LOADED + (
        "import os, sparsile\n"
        "from sparsile.backend import preload\n"
        "preload.start()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if mapped('libllvmlite') and mapped('libnvJitLink') else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"))
    assert out == "0"
