"""Packaging: pyproject lists every folder of modules and their data, a wheel built from a copy of
the checkout holds them and works when installed alone, and everything the package imports at
module level is either the standard library or a declared dependency (so that a green run cannot
hide a package installed by hand)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGES: list[str] = SETUPTOOLS["packages"]
NOT_PACKAGES = {"benchmarks", "scripts", "build", "dist", "docs"}  # scripts and docs of a checkout
DATA_SUFFIXES = (".spk", ".lark")
# import name -> distribution name, for the dependencies in pyproject
DISTRIBUTIONS = {"lark": "lark", "llvmlite": "llvmlite", "numpy": "numpy", "cuda": "cuda-python",
                 "ml_dtypes": "ml_dtypes", "pytest": "pytest", "hypothesis": "hypothesis",
                 "torch": "torch", "jax": "jax"}


def source_files() -> list[Path]:
    """The checkout's files (tracked by git when this is a git checkout), relative to ROOT."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode().split("\0")
        return sorted(Path(p) for p in listed if p and (ROOT / p).is_file())
    skip = {".git", ".venv", "__pycache__", "build", "dist"}
    return sorted(p.relative_to(ROOT) for p in ROOT.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(ROOT).parts))


def dotted(folder: Path) -> str:
    return ".".join(("sparsile", *folder.parts)) if folder.parts else "sparsile"


def module_folders() -> set[Path]:
    return {p.parent for p in source_files() if p.suffix == ".py" and not (p.parts and p.parts[0] in NOT_PACKAGES)}


def test_every_folder_of_modules_is_a_listed_package():
    missing = sorted(dotted(f) for f in module_folders() if dotted(f) not in PACKAGES)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    for package in PACKAGES:
        folder = ROOT.joinpath(*package.split(".")[1:])
        assert folder.is_dir(), f"listed package {package} has no folder"


def test_package_data_covers_the_kernel_and_grammar_files():
    data = SETUPTOOLS["package-data"]
    for path in source_files():
        if path.suffix not in DATA_SUFFIXES or path.parts[0] in NOT_PACKAGES:
            continue
        owners = [pkg for pkg in PACKAGES if path.parent.parts[:len(pkg.split(".")) - 1] == tuple(pkg.split(".")[1:])]
        owner = max(owners, key=len)
        relative = path.relative_to(Path(*owner.split(".")[1:])) if owner != "sparsile" else path
        assert any(relative.match(pattern) for pattern in data.get(owner, [])), \
            f"{path} is not package data of {owner} in pyproject.toml"


def _top_level_imports(path: Path) -> set[str]:
    """Absolute modules imported by statements that run at import time (module body, not functions)."""
    names: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.If | ast.Try | ast.With):  # guarded imports still run at import time
            pending.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.ExceptHandler):
            pending.extend(node.body)
    return names


def _distribution_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_module_level_imports_are_declared_dependencies():
    """Optional packages (torch, cupy, matplotlib, triton) may only be imported inside functions."""
    runtime = _distribution_names(PYPROJECT["project"]["dependencies"])
    test_extra = _distribution_names(PYPROJECT["project"]["optional-dependencies"]["test"])
    problems = []
    for path in source_files():
        if path.suffix != ".py" or (path.parts and path.parts[0] in NOT_PACKAGES):
            continue
        is_test = path.parts[0] == "tests" or path.name == "conftest.py"
        allowed = runtime | (test_extra if is_test else set())
        if len(path.parts) > 2 and path.parts[0] == "integrations":  # integrations/<extra>/ may use that extra
            allowed |= _distribution_names(PYPROJECT["project"]["optional-dependencies"].get(path.parts[1], []))
        for name in _top_level_imports(ROOT / path):
            if name in sys.stdlib_module_names or name == "sparsile":
                continue
            dist = DISTRIBUTIONS.get(name)
            if dist is None or dist.lower() not in allowed:
                problems.append(f"{path}: imports {name} at module level")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_wheel_holds_modules_and_data_and_works_alone(tmp_path):
    src = tmp_path / "src"
    for path in source_files():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, src / path)
    out = tmp_path / "wheel"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q", "-w", str(out),
                            str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = out.glob("sparsile-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in source_files():
        in_package = path.parts[0] not in NOT_PACKAGES and dotted(path.parent) in PACKAGES
        if in_package and (path.suffix == ".py" or path.suffix in DATA_SUFFIXES):
            assert f"sparsile/{path.as_posix()}" in names, f"{path} is missing from the wheel"
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "sparsile = sparsile.cli:main" in entry_points
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    for requirement in PYPROJECT["project"]["dependencies"]:
        assert f"Requires-Dist: {requirement.split('>')[0]}" in metadata

    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "-q",
                              "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    probe = ("import sparsile, sys; from sparsile.stdlib.kernels import kernel_module; "
             "from sparsile.frontend.syntax.parser import parse_module; "
             "assert sparsile.__file__.startswith(sys.argv[1]), sparsile.__file__; "
             "print(sorted(kernel_module().kernels)[0]); "
             "print(len(sparsile.load(sparsile.__path__[0] + '/examples/vector_add.spk').kernels))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == ["sparse_gemm_bf16", "1"]


def test_the_torch_extra_requires_the_integrations_floor():
    """pyproject's ``torch`` extra and the SP0908 check (integrations/torch_version.py) name one floor."""
    from sparsile.integrations.torch_version import TORCH_REQUIREMENT

    assert PYPROJECT["project"]["optional-dependencies"]["torch"] == [TORCH_REQUIREMENT]


def test_version_attribute_matches_pyproject():
    """The compile cache keys on ``sparsile.__version__`` (driver/cache.py compiler_version)."""
    import sparsile

    assert sparsile.__version__ == PYPROJECT["project"]["version"]
    from importlib.metadata import version

    assert version("sparsile") == sparsile.__version__
