"""The package layout is the architecture: src/lyre/'s folders are layers, imports point down only,
and no module imports itself back through others. Read from the code's own imports (TYPE_CHECKING
imports and imports inside functions included), so a change that breaks the layering fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO_ROOT

SRC = REPO_ROOT / "src" / "lyre"

# Each package's layer, bottom up (DESIGN.md section 1). A package may import its own modules and
# those of lower layers. The entry points at the top (server, tools, benchmarks) may use each other
# (the server can serve the benchmark's peer), but nothing below imports them.
LAYERS = {
    "lyre": 0,  # the package's face: __version__ and the library API, imported on first use
    "errors": 0,
    "cpu": 0,  # the CPU ledger every part charges (lyre.cpu)
    "v1": 0,  # generated gRPC stubs
    "integrations": 0,  # client-side adapters (Pipecat): they speak to a server, they import none of it
    "model": 1, "text": 1,  # the text front end: pure Python, below everything that reads text
    "config": 2,
    "engine": 3, "codec": 3, "audio": 3, "storage": 3,
    "trust": 4, "family": 4,  # model families: what differs between them, below the family-agnostic core
    "core": 5,
    "service": 6,
    "api": 7,
    "server": 8, "tools": 8, "benchmarks": 8,
    "cli": 9, "gpucheck": 9,  # the GPU acceptance run drives the build, both engines and the benchmark
    "__main__": 10,
}
SIBLINGS_AT_THE_TOP = 8
MAX_LINES = 420  # ~400: split a module by job before it grows past this


def _sources(root: Path = SRC) -> dict[str, Path]:
    """module name -> file, for the package at ``root`` (generated stubs and migrations left out)."""
    out = {}
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] == "v1" or "migrations" in path.parts:
            continue
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the lyre modules it imports (``from lyre.x import y`` counts as lyre.x.y when y is a module)."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "lyre":
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "lyre"}
        edges[name] = {m for m in found if m != name}
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_package_has_a_layer():
    assert {_package(m) for m in _sources()} <= set(LAYERS), "a new package needs its place in LAYERS"


def test_imports_point_down_only():
    upward = []
    for module, targets in _imports(_sources()).items():
        here = _package(module)
        for target in targets:
            there = _package(target)
            if there == here or (LAYERS[here] == LAYERS[there] == SIBLINGS_AT_THE_TOP):
                continue
            if LAYERS[there] >= LAYERS[here]:
                upward.append(f"{module} imports {target} ({here} is layer {LAYERS[here]}, {there} layer {LAYERS[there]})")
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


def test_no_module_imports_itself_back():
    edges = _imports(_sources())
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in edges:
        if module not in index:
            visit(module)
    assert not cycles, f"modules that import each other (through others): {cycles}"


def test_the_reading_sees_imports_inside_functions_and_of_modules(tmp_path):
    # (so that the two tests above can fail: a late import inside a function is an import too)
    (tmp_path / "lyre" / "core").mkdir(parents=True)
    (tmp_path / "lyre" / "core" / "a.py").write_text("from lyre.service import b\n")
    (tmp_path / "lyre" / "service").mkdir()
    (tmp_path / "lyre" / "service" / "b.py").write_text("def f():\n    from lyre.core.a import x\n")
    assert _imports(_sources(tmp_path / "lyre")) == {"lyre.core.a": {"lyre.service.b"},
                                                       "lyre.service.b": {"lyre.core.a"}}


def test_no_source_file_is_longer_than_a_reader_can_hold():
    long = {str(p.relative_to(REPO_ROOT)): n for p in _sources().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by job: {long}"


def test_the_root_of_the_package_holds_only_its_entry_points():
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py", "cli.py", "errors.py", "server.py"]
