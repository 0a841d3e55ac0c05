"""The import root and the layering the architecture promises (docs/architecture.md, "Layout").

- Everything is imported under ``mmlake.``; no bare ``cache``, ``flows``, ``ingest``, ``lineage`` or
  ``preprocessing`` import anywhere, and none of those names is importable from an installed
  environment.
- Imports go downwards only: ``flows`` may use everything; ``preprocessing``, ``lineage`` and ``cache``
  use the ground floor (``mmlake`` itself: errors, settings, lake); ``ingest`` too; the ground floor
  uses no other package of the project.
- No module imports itself back through others: no circle among the modules of any package, at any
  depth (an import inside a function counts too: it is a circle all the same when it runs).
- No file a user reads points at the design folder outside the repository.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = {
    "ingest": "ingest",
    "preprocessing": "preprocessing",
    "lineage": "lineage",
    "cache": "cache",
    "flows": "flows",
}
BARE = set(PACKAGES)
#: package -> the project packages its modules may import (besides itself and the ground floor).
ALLOWED = {
    "ingest": set(),
    "preprocessing": set(),
    "lineage": set(),
    "cache": set(),
    "flows": {"ingest", "preprocessing", "lineage", "cache"},
}
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
        bare = subprocess.run(
            [sys.executable, "-c", f"import {name}"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr, f"`import {name}` works"
        rooted = subprocess.run(
            [sys.executable, "-c", f"import mmlake.{name} as m; print(m.__name__)"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
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
            upward_from_ground = (
                me == "ground" and module not in GROUND and not module.startswith(tuple(f"{g}." for g in GROUND))
            )
            if upward_from_ground or owner not in allowed:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not offenders, f"{package} imports upwards or sideways:\n" + "\n".join(offenders)


def _module_names() -> dict[str, Path]:
    """Every module of the project by its import name (``mmlake.ingest.wire``; a package by its own; a
    native module by its stub)."""
    names: dict[str, Path] = {}
    for package, folder in [("mmlake", "mmlake"), *((f"mmlake.{p}", f) for p, f in PACKAGES.items())]:
        for path in [*_python_files(folder), *sorted((ROOT / folder).rglob("*.pyi"))]:
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names[".".join([package, *parts])] = path
    return names


def _import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (``from mmlake.x import y`` is module ``mmlake.x.y``
    where that is a module, else ``mmlake.x``)."""
    names = _module_names()
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                wanted = [
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in names else node.module
                    for alias in node.names
                ]
            else:
                continue
            for module in wanted:
                while module and module not in names:
                    module = module.rpartition(".")[0]
                if module and module != name:
                    targets.add(module)
        graph[name] = targets
    return graph


def test_no_module_imports_itself_back_through_others() -> None:
    graph = _import_graph()
    assert {"mmlake.ingest.engine", "mmlake.flows.cli", "mmlake.cache.core"} <= set(graph)
    assert "mmlake.ingest.wire" in graph["mmlake.ingest.routing"]  # the graph sees real edges

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen = {start}
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    return [*path, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = [c for name in sorted(graph) if (c := cycle_from(name))]
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_project_speaks_for_itself() -> None:
    """README, docs and the library never send users to the design folder beside the repository."""
    files = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *_python_files("mmlake", *PACKAGES),
        *_python_files("examples", "bench"),
        ROOT / "flows" / "prefect.yaml",
        ROOT / "pyproject.toml",
    ]
    offenders = [
        str(p.relative_to(ROOT)) for p in files if "../shared" in p.read_text() or "shared/design" in p.read_text()
    ]
    assert not offenders, f"these point at ../shared: {offenders}"
