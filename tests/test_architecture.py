"""The package's import graph, built from the source with ``ast``: no circles, layers point down.

Every import counts, including those inside functions (a circle hidden in a function is
still a circle); only ``if TYPE_CHECKING:`` blocks are left out, since they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "napari_attnreg"

# Lowest first: a module may import its own layer and the layers below, never one above.
LAYERS = [
    ("napari_attnreg.core.files", "napari_attnreg.core.docs", "napari_attnreg.testing"),
    # the real test article is built from and loaded as a model
    ("napari_attnreg.core.models", "napari_attnreg.testing.real_article"),
    ("napari_attnreg.core.stats",),
    ("napari_attnreg.core.results",),
    ("napari_attnreg.core.run", "napari_attnreg.core"),
    ("napari_attnreg.io", "napari_attnreg.samples", "napari_attnreg.session"),
    ("napari_attnreg.batch",),
    ("napari_attnreg._napari", "napari_attnreg.notebook", "napari_attnreg.cli",
     "napari_attnreg"),
]
GUI_TOOLKITS = ("napari", "qtpy", "PyQt5", "PyQt6", "PySide2", "PySide6", "superqt",
                "magicgui", "ipywidgets", "ipyevents", "IPython")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, list[str]]]:
    """``(imported module, imported names)`` for every import in a file that can run."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, []) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                names = [alias.name for alias in child.names]
                submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
                found.extend((sub, []) for sub in submodules)
                other = [n for n in names if f"{base}.{n}" not in modules]
                if other or not submodules:  # ``from pkg import sub`` is an edge to sub only
                    found.append((base, other))
            visit(child)

    visit(tree)
    return found


def _graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[str, list[str]]]]]:
    files = {module_name(p): p for p in (SRC / PACKAGE).rglob("*.py")}
    modules = set(files)
    raw = {name: imports_of(path, modules) for name, path in files.items()}
    edges = {name: {target for target, _ in found if target in modules and target != name}
             for name, found in raw.items()}
    return edges, raw


def _layer(module: str) -> int:
    best, rank = -1, len(LAYERS)
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    return rank


def test_graph_sees_the_whole_package():
    edges, _ = _graph()
    assert "napari_attnreg.core.run.engine" in edges
    assert "napari_attnreg.core.models.backbones" in edges["napari_attnreg.core.run.engine"]
    assert all(_layer(m) < len(LAYERS) for m in edges), "a module outside every layer"


def test_no_import_circles():
    edges, _ = _graph()
    on_path: list[str] = []
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def walk(node: str) -> None:
        state[node] = 1
        on_path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circles.append(on_path[on_path.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        on_path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_layers_point_down():
    edges, _ = _graph()
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
              for m, targets in edges.items() for t in targets
              if _layer(t) > _layer(m) and not (m == PACKAGE or m.startswith(t + "."))]
    # a package's __init__ may name its own submodules lazily; nothing else goes up
    assert not upward, "\n".join(sorted(upward))


@pytest.mark.parametrize("layer", ["core", "io", "batch", "cli", "session"])
def test_no_gui_toolkit_below_the_front_ends(layer):
    _, raw = _graph()
    bad = [f"{m} imports {t}" for m, found in raw.items()
           if m == f"{PACKAGE}.{layer}" or m.startswith(f"{PACKAGE}.{layer}.")
           for t, _ in found if t.split(".")[0] in GUI_TOOLKITS]
    assert not bad, "\n".join(bad)


def test_no_private_name_imported_across_modules():
    edges, raw = _graph()
    bad = [f"{m} imports {name} from {t}" for m, found in raw.items() for t, names in found
           if t in edges and t != m for name in names
           if name.startswith("_") and not name.startswith("__")]
    assert not bad, "\n".join(sorted(bad))
