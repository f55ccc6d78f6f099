"""The house plan in code: one-way imports, no cycles, one module per name.

``lint-imports`` (the contract in ``.importlinter``) checks the layers; these tests check what a
layers contract cannot: that no group of modules inside ``runtime`` imports itself round in a
circle (imports inside functions included, since grimp reads every import statement), and that no
two modules share a file name, so that a module's name says which one it is.
They also check that the contract leaves no module of ``runtime`` out of its layers.
"""

from __future__ import annotations

import configparser
import re
from collections import Counter
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "runtime"
GENERATED = "runtime.frontends.grpc.generated"


def _import_graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("runtime")
    modules = {m for m in graph.modules if not m.startswith(GENERATED)}
    return {m: {d for d in graph.find_modules_directly_imported_by(m) if d in modules} for m in modules}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _is_package_edge(importer: str, imported: str) -> bool:
    """A package's ``__init__`` re-exporting its own submodules is not a cycle of ideas."""
    return imported.startswith(importer + ".") or importer.startswith(imported + ".")


def test_no_import_cycles_inside_runtime() -> None:
    edges = {m: {d for d in deps if not _is_package_edge(m, d)} for m, deps in _import_graph().items()}
    assert _cycles(edges) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_two_modules_share_a_name() -> None:
    names = Counter(
        path.name
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and "generated" not in path.parts
    )
    assert [name for name, count in names.items() if count > 1] == []


def _contract_layers() -> list[str]:
    """The modules and packages the layers contract of ``.importlinter`` names."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    named: list[str] = []
    for section in parser.sections():
        if parser.get(section, "type", fallback=None) == "layers":
            for line in parser.get(section, "layers").split():
                named.extend(name for name in re.split(r"[|:]", line) if name.strip())
    return [name.strip() for name in named]


def test_the_layers_contract_names_every_module() -> None:
    """Every module of ``runtime`` sits in a layer (a package's ``__init__`` goes with its package's
    modules), so that none can import upwards unnoticed."""
    named = _contract_layers()
    unnamed = sorted(
        module
        for module, _ in _import_graph().items()
        if module != "runtime"
        and not (PACKAGE / (module.removeprefix("runtime.").replace(".", "/") + "/__init__.py")).exists()
        and not any(module == layer or module.startswith(layer + ".") for layer in named)
    )
    assert unnamed == []


MAP_DOCS = ("CONTRIBUTING.md", "docs/architecture.md")
SOURCES = ("runtime", "tests", "scripts", "benchmarks", "examples")


def _read_doc(doc: str) -> str:
    """A document's text with ``folder/{a,b}.py`` written out as ``folder/a.py`` and ``folder/b.py``."""

    def expand(match: re.Match[str]) -> str:
        return ", ".join(f"`{match[1]}{name.strip()}.py`" for name in match[2].split(","))

    return re.sub(r"`([\w/]*/)\{([\w, ]+)\}\.py`", expand, (ROOT / doc).read_text())


def test_the_docs_name_only_modules_that_exist() -> None:
    """The package map (CONTRIBUTING.md) and the drawings (docs/architecture.md) go stale when a
    module moves: every ``runtime/...`` path and every ``name.py`` they mention must exist."""
    files = {path.name for folder in SOURCES for path in (ROOT / folder).rglob("*.py")}
    stale = []
    for doc in MAP_DOCS:
        text = _read_doc(doc)
        stale += [
            f"{doc}: {p}"
            for p in re.findall(r"runtime/[\w/]*\w(?:\.py)?", text)
            if not (ROOT / p).exists() and not (ROOT / f"{p}.py").exists()
        ]
        stale += [f"{doc}: {name}" for name in re.findall(r"\b\w+\.py\b", text) if name not in files]
    assert stale == []


def test_the_package_map_names_every_module() -> None:
    """CONTRIBUTING.md's map of the packages names each module of ``runtime`` (by its path, its file
    name, or a package folder it documents as a whole, like ``runtime/torch/``)."""
    text = _read_doc("CONTRIBUTING.md")
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if path.name == "__init__.py" or "generated" in relative.parts:
            continue
        folder = f"{relative.parent.as_posix()}/"
        parts = relative.parts
        if relative.as_posix() in text or any(
            f"`{'/'.join(parts[i:])}`" in text for i in range(1, len(parts))
        ):
            continue
        if folder != "runtime/" and f"`{folder}`" in text and f"`{folder}` (" not in text:
            continue  # the whole package documented as one
        missing.append(relative.as_posix())
    assert missing == []


def test_every_module_has_its_test_file_by_name() -> None:
    """``runtime/<folder>/<module>.py`` is tested in ``tests/<folder>/test_<module>.py`` (a module
    of ``runtime/`` itself in ``tests/test_<module>.py``), so that a module's tests are found by
    its name."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or "generated" in relative.parts:
            continue
        expected = ROOT / "tests" / relative.parent / f"test_{path.stem}.py"
        if not expected.exists():
            missing.append(f"{relative.as_posix()}: {expected.relative_to(ROOT).as_posix()}")
    assert missing == []
