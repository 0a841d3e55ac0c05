"""The import root and the layering the architecture promises (docs/architecture.md, "Layout").

- Everything is imported under ``mmlake.``; no bare ``cache``, ``flows``, ``ingest``, ``lineage`` or
  ``preprocessing`` import anywhere, and none of those names is importable from an installed
  environment.
- Imports go downwards only: ``flows`` may use everything; ``preprocessing``, ``lineage`` and ``cache``
  use the ground floor (``mmlake`` itself: errors, settings, lake); ``ingest`` too; the ground floor
  uses no other package of the project.
- The modules of ``flows/`` import one another without a circle.
- No file a user reads points at the design folder outside the repository.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = {"ingest": "ingest", "preprocessing": "preprocessing", "lineage": "lineage", "cache": "cache",
            "flows": "flows"}
BARE = set(PACKAGES)
#: package -> the project packages its modules may import (besides itself and the ground floor). The
#: lineage query reads Kafka offsets, whose txn app ids are ingest's: the one Kafka-specific use.
ALLOWED = {"ingest": set(), "preprocessing": set(), "lineage": {"ingest"}, "cache": set(),
           "flows": {"ingest", "preprocessing", "lineage", "cache"}}
GROUND = {"mmlake", "mmlake.errors", "mmlake.lake", "mmlake.settings"}


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, at any depth (function-level too), and
    in string constants that are code (``python -c`` programs a test starts)."""
    found = _imports_in(ast.parse(path.read_text(), filename=str(path)))
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                program = ast.parse(node.value)
            except SyntaxError:
                continue
            found += [(node.lineno, module) for _, module in _imports_in(program)]
    return found


def _imports_in(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_no_file_imports_a_bare_package_name() -> None:
    offenders = []
    for path in _python_files("mmlake", *PACKAGES, "tests", "bench", "examples"):
        for line, module in _imports(path):
            if module.split(".")[0] in BARE:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not offenders, "bare imports (use mmlake.<package>):\n" + "\n".join(offenders)


def test_only_the_mmlake_root_is_installed(tmp_path: Path) -> None:
    """From a directory outside the repository, ``import cache`` fails and ``import mmlake.cache`` works."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    for name in sorted(BARE):
        bare = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True)
        assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr, f"`import {name}` works"
        rooted = subprocess.run([sys.executable, "-c", f"import mmlake.{name} as m; print(m.__name__)"],
                                cwd=tmp_path, env=env, capture_output=True, text=True)
        assert rooted.returncode == 0, rooted.stderr
        assert rooted.stdout.strip() == f"mmlake.{name}"


def _owner(module: str) -> str | None:
    """The project package a module name belongs to ('ground' for mmlake's own modules), or None."""
    parts = module.split(".")
    if parts[0] != "mmlake":
        return None
    if len(parts) > 1 and parts[1] in PACKAGES:
        return parts[1]
    return "ground"


@pytest.mark.parametrize("package", ["mmlake", *PACKAGES])
def test_imports_go_downwards_only(package: str) -> None:
    me = "ground" if package == "mmlake" else package
    allowed = {"ground", me} | ALLOWED.get(package, set())
    if me == "ground":
        allowed = {"ground"}
    offenders = []
    for path in _python_files(package):
        for line, module in _imports(path):
            owner = _owner(module)
            if owner is None:
                continue
            if me == "ground" and module not in GROUND and not module.startswith(tuple(f"{g}." for g in GROUND)):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {module}")
            elif owner not in allowed:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not offenders, f"{package} imports upwards or sideways:\n" + "\n".join(offenders)


def test_flows_modules_import_each_other_without_a_circle() -> None:
    modules = {p.stem for p in (ROOT / "flows").glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        targets = set()
        for _, module in _imports(ROOT / "flows" / f"{name}.py"):
            parts = module.split(".")
            if parts[:2] == ["mmlake", "flows"] and len(parts) > 2 and parts[2] in modules and parts[2] != name:
                targets.add(parts[2])
        graph[name] = targets

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return [*path, start]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = [c for name in sorted(modules) if (c := cycle_from(name))]
    assert not circles, "import circles in flows/: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_project_speaks_for_itself() -> None:
    """README, docs and the library never send users to the design folder beside the repository."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *_python_files("mmlake", *PACKAGES),
             *_python_files("examples", "bench"), ROOT / "flows" / "prefect.yaml", ROOT / "pyproject.toml"]
    offenders = [str(p.relative_to(ROOT)) for p in files if "../shared" in p.read_text() or "shared/design" in p.read_text()]
    assert not offenders, f"these point at ../shared: {offenders}"
