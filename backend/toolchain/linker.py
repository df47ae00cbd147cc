"""PTX -> cubin with nvJitLink (:mod:`.nvjitlink`, a ctypes binding), plus cubin inspection helpers.

The project needs no CUDA toolkit: nvJitLink (PyPI ``nvidia-nvjitlink``) contains ptxas. The
``ptxas`` binary and ``nvdisasm`` are only used by tests and tools when they happen to exist.

Codes: ``SP0610`` nvJitLink rejected the PTX (the log is in the diagnostic's notes),
``SP0611`` nvJitLink is not installed or not usable.

CUDA ELF facts used here, found empirically with cubins built by nvJitLink 13.5 and ptxas 13.0
for every target in the table (``tests/backend/test_linker.py`` re-checks them):

* ``e_ident[EI_OSABI]`` = 0x41, ``e_ident[EI_ABIVERSION]`` = 8, ``e_machine`` = 190 (EM_CUDA).
* ``e_flags`` bits 8-15 hold the SM number (0x50 = sm_80, 0x5a = sm_90, 0x64 = sm_100,
  0x6e = sm_110, 0x78 = sm_120); the ``a`` and ``f`` variants have the same ``e_flags``.
  Older cubins (ABI version < 8, CUDA 12 and before) kept the SM in bits 0-7; that branch is
  from memory and not checked here (no old toolkit available).
* An ``a`` target is marked in the ``.nv.compat`` section: an attribute record with format
  byte 2 and attribute id 9 holds 1 for sm_90a/sm_100a/..., 0 otherwise. Family (``f``)
  cubins are byte-identical to plain ones for a trivial kernel, so ``f`` is not recoverable.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...frontend.diagnostics import CompileError, Diagnostic, InternalError
from ...target.targets import Target
from . import nvjitlink, whole_program

if TYPE_CHECKING:
    import subprocess

SP_LINK_FAILED = "SP0610"
NO_CACHE = "-no-cache"
"""nvJitLink's own cache lives in the CUDA driver's compute cache: on a machine with a GPU its first
link initializes the driver (``cuInit``, 185 ms of a 190 ms first link on the H200 host, nvJitLink
13.0 and 13.4; measured 2026-11-30) and loads libcuda, even in a process that only compiles.
sparsile caches cubins itself (driver/cache.py), so it links with ``-no-cache``: 16 ms, no driver."""
SP_NVJITLINK_MISSING = "SP0611"

EM_CUDA = 190
_ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class LinkResult:
    """A linked cubin and nvJitLink's info log (ptxas register/spill report with ``-verbose``)."""

    cubin: bytes
    info_log: str


def _library() -> nvjitlink.NvJitLink:
    try:
        return nvjitlink.library()
    except nvjitlink.NvJitLinkUnavailable as exc:
        raise CompileError([Diagnostic(
            SP_NVJITLINK_MISSING, f"nvJitLink is not available ({exc})",
            help="install the `nvidia-nvjitlink` package (`pip install nvidia-nvjitlink`), or set "
                 f"{nvjitlink.ENV_LIBRARY} to the path of a libnvJitLink")]) from None


def nvjitlink_version() -> tuple[int, int]:
    """nvJitLink's ``(major, minor)`` version, e.g. ``(13, 5)``."""
    return _library().version()


def ptx_to_cubin(ptx: str, target: Target, *, opt_level: int = 3, name: str = "kernel.ptx",
                 verbose: bool = True) -> LinkResult:
    """Assemble and link ``ptx`` for ``target`` with nvJitLink (a PTX with ``setmaxnreg``: with a
    whole-program ptxas when one is configured, :mod:`.whole_program`).

    Options: ``target.nvjitlink_arch`` (e.g. ``-arch=sm_100a``), ``-O<opt_level>``, ``-no-cache``
    (see :data:`NO_CACHE`) and, with ``verbose``, ``-verbose`` (the info log then reports registers
    and spills per kernel). A
    rejected PTX becomes :class:`CompileError` ``SP0610`` with nvJitLink's error log as notes.
    """
    if opt_level not in (0, 1, 2, 3):
        raise InternalError(f"opt_level must be 0..3, got {opt_level!r}")
    if whole_program.needs_whole_program(ptx):  # setmaxnreg survives only whole-program ptxas
        ptxas = whole_program.whole_program_ptxas()
        if ptxas is not None:
            return LinkResult(*whole_program.assemble(ptx, target, ptxas, opt_level=opt_level, name=name))
        whole_program.warn_budgets_dropped(name)
    lib = _library()
    options = [target.nvjitlink_arch, f"-O{opt_level}", NO_CACHE] + (["-verbose"] if verbose else [])
    try:
        linked = lib.link_ptx(ptx.encode("utf-8"), options, name)
    except nvjitlink.NvJitLinkError as exc:
        if exc.call == "nvJitLinkCreate":
            raise CompileError([Diagnostic(
                SP_LINK_FAILED, f"nvJitLink refused the options {' '.join(options)} ({exc.reason})",
                help=f"this nvJitLink ({'.'.join(map(str, lib.version()))}) may be too old for "
                     f"{target.name}; upgrade `nvidia-nvjitlink`")]) from None
        notes = tuple(line for line in exc.log.splitlines() if line.strip()) or (str(exc),)
        raise CompileError([Diagnostic(
            SP_LINK_FAILED, f"nvJitLink could not turn {name} into a cubin for {target.name} ({exc.reason})",
            notes=notes,
            help="this is most likely a sparsile code-generation bug; please report it with the "
                 "kernel and this log")]) from None
    return LinkResult(linked.cubin, linked.info_log)


# --------------------------------------------------------------------------------------------
# Cubin inspection
# --------------------------------------------------------------------------------------------


def is_cuda_elf(blob: bytes) -> bool:
    """True for a 64-bit little-endian ELF whose ``e_machine`` is EM_CUDA (190)."""
    if len(blob) < 64 or blob[:4] != _ELF_MAGIC or blob[4] != 2 or blob[5] != 1:
        return False
    return struct.unpack_from("<H", blob, 18)[0] == EM_CUDA


def _require_cuda_elf(blob: bytes) -> None:
    if not is_cuda_elf(blob):
        raise ValueError("not a 64-bit CUDA ELF (cubin)")


def elf_sm_arch(blob: bytes) -> int:
    """The SM number a cubin was built for (e.g. 90 for sm_90 and sm_90a, 100 for sm_100a),
    from ``e_flags`` (see the module docstring for the encoding). ``ValueError`` for non-cubins."""
    _require_cuda_elf(blob)
    flags = struct.unpack_from("<I", blob, 48)[0]
    abi_version = blob[8]
    return (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF


def _sections(blob: bytes) -> dict[str, bytes]:
    shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", blob, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * entsize) for i in range(count)]
    if not headers or names_index >= count:
        return {}
    names_offset = headers[names_index][4]
    out: dict[str, bytes] = {}
    for header in headers:
        start = names_offset + header[0]
        name = blob[start:blob.index(b"\x00", start)].decode("ascii", errors="replace")
        if header[1] != 8:  # SHT_NOBITS has no file contents
            out[name] = blob[header[4]:header[4] + header[5]]
    return out


def elf_is_arch_specific(blob: bytes) -> bool | None:
    """Whether the cubin was built for an ``a`` target (sm_90a, sm_100a, ...), read from the
    ``.nv.compat`` attribute 9. ``False`` below sm_90 (no ``a`` targets exist there; those
    cubins have no ``.nv.compat``); ``None`` when a newer cubin has no such record."""
    if elf_sm_arch(blob) < 90:
        return False
    try:
        compat = _sections(blob).get(".nv.compat")
    except (struct.error, ValueError):
        return None
    if not compat:
        return None
    pos = 0
    while pos + 4 <= len(compat):
        fmt, attr = compat[pos], compat[pos + 1]
        if fmt == 2 and attr == 9:
            return bool(compat[pos + 2])
        if fmt in (2, 3):
            pos += 4
        elif fmt == 4:
            pos += 4 + struct.unpack_from("<H", compat, pos + 2)[0]
        else:
            return None
    return None


# --------------------------------------------------------------------------------------------
# Optional tools: ptxas, nvdisasm
# --------------------------------------------------------------------------------------------


def ptxas_path() -> str | None:
    """``ptxas`` on PATH or in ``$CUDA_HOME/bin``, else ``None``."""
    import shutil

    found = shutil.which("ptxas")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "ptxas").is_file():
            return str(Path(root) / "bin" / "ptxas")
    return None


def ptxas_available() -> bool:
    return ptxas_path() is not None


def assemble_with_ptxas(ptx: str, target: Target, *, extra_args: tuple[str, ...] = (),
                        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``ptxas -arch=<target>`` on ``ptx`` (for tests and tools; sparsile itself never
    needs ptxas). ``FileNotFoundError`` when ptxas is not installed."""
    import subprocess
    import tempfile

    exe = ptxas_path()
    if exe is None:
        raise FileNotFoundError("ptxas is not installed")
    with tempfile.TemporaryDirectory(prefix="sparsile-ptxas-") as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        cmd = [exe, f"-arch={target.arch_option}", *extra_args, str(src), "-o", str(Path(tmp) / "kernel.cubin")]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def nvdisasm_path() -> str | None:
    """The ``nvdisasm`` of PyPI ``nvidia-cuda-nvdisasm`` (``site-packages/nvidia/cu13/bin``
    for CUDA 13, ``nvidia/cuda_nvdisasm/bin`` for CUDA 12 wheels), else one on PATH."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        for sub in ("cu13/bin", "cuda_nvdisasm/bin", "cu12/bin"):
            candidate = Path(root) / sub / "nvdisasm"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("nvdisasm")


def nvdisasm_sass(cubin: bytes, *, timeout: float = 120) -> str | None:
    """The SASS listing of ``cubin`` (``nvdisasm -c``), or ``None`` when nvdisasm is missing
    or fails."""
    import subprocess
    import tempfile

    exe = nvdisasm_path()
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="sparsile-nvdisasm-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        try:
            proc = subprocess.run([exe, "-c", str(path)], capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return proc.stdout if proc.returncode == 0 else None
