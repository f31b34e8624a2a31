"""The package's layers: each folder (or module at the package's top level) imports only
from the layers below its own; the modules import each other without a circle; and so do
the C kernels' files, by `#include "..."`. Every import statement counts, one deferred into
a function body or kept for type checking too: it is a dependency all the same."""

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import minivllm

PACKAGE = Path(minivllm.__file__).parent

# Bottom first. A unit (a folder of the package, or one of its top-level modules) imports
# from the layers below its own only: not from above, nor from another unit of its layer.
LAYERS = [
    ("json_object", "structured_output"),
    # the per-request types the API takes and gives back
    ("sampling_params", "pooling_params", "lora_request", "outputs"),
    ("generation_fields", "beam_search"),
    ("core",),  # the scheduler: pure Python, no torch (test_imports.py)
    ("config",),
    ("model",),
    ("lora",),  # its layers wrap the model's
    ("engine",),
    ("distributed",),
    ("entrypoints",),
    ("bench",),  # a client of the engine and the server, with their arguments
    ("sim",),  # replays bench's workloads on the scheduler
    # The façades, free to import any of the others: the package's lazy names, the
    # `minivllm` command, and `python -m minivllm`, which runs it.
    ("minivllm", "cli"),
    ("__main__",),
]
RANK = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module itself, else the package holding it (`from pkg import name`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """(the package's module imported, line) for every import statement in the module."""
    path = MODULES[module]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            # a name of the lazy façade (`from minivllm import LLM`) is its home module's
            names = [minivllm._HOMES.get(alias.name, f"{base}.{alias.name}")
                     if base == "minivllm" else f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in map(_resolve, names):
            if target not in (None, module):
                yield target, node.lineno


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    return {module: {target for target, _ in imports_of(module)} for module in MODULES}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node, and the nodes that reach
    themselves (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while not component or node not in component:
                component.add(stack.pop())
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


def unit_of(module: str) -> str:
    """The folder a module is in (core, model, ...), or its own name at the top level."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_arrows(imports: dict[str, list[tuple[str, int]]]) -> list[str]:
    """'file:line: unit -> unit' for each import that is not of a lower layer."""
    found = []
    for module, targets in imports.items():
        unit = unit_of(module)
        for target, line in targets:
            to = unit_of(target)
            if to != unit and RANK[to] >= RANK[unit]:
                found.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: "
                             f"{unit} -> {to}")
    return found


def test_every_unit_has_a_layer():
    units = {unit_of(module) for module in MODULES}
    assert units - RANK.keys() == set(), "place these in LAYERS"


def test_the_folders_import_only_from_the_layers_below():
    imports = {module: list(imports_of(module)) for module in MODULES}
    assert sum(map(len, imports.values())) > 100, "no imports found: the graph is broken"
    arrows = upward_arrows(imports)
    assert arrows == [], "imports of the same or a higher layer:\n" + "\n".join(arrows)


def test_an_upward_arrow_is_found_with_its_line():
    arrows = upward_arrows({"minivllm.core.request": [("minivllm.lora.request", 19),
                                                      ("minivllm.sampling_params", 21)]})
    assert arrows == ["minivllm/core/request.py:19: core -> lora"]


def test_no_import_circle_in_the_package():
    found = circles(import_graph())
    assert found == [], f"modules that import each other: {found}"


def test_the_circle_finder_finds_a_deferred_import_back():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(graph) == [{"a", "b", "c"}, {"e"}]


def test_config_imports_nothing_from_the_engine_or_the_policies():
    """config.py is read by everything below the entrypoints: it may import core/'s
    registries and configs, not the engine or the policy classes (each policy checks its own
    options, found through core/policy.py's registry)."""
    imported = import_graph()["minivllm.config"]
    assert imported, "no imports found: the graph is broken"
    assert not [m for m in imported
                if m.startswith(("minivllm.engine", "minivllm.core.policies"))], imported


C_SUFFIXES = (".c", ".h", ".cpp", ".hpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def include_graph() -> dict[Path, set[Path]]:
    """C file -> the package's files it includes (`#include "..."`, beside the includer)."""
    files = [p for p in PACKAGE.rglob("*") if p.suffix in C_SUFFIXES]
    return {path: {(path.parent / name).resolve() for name in INCLUDE.findall(path.read_text())}
            for path in (p.resolve() for p in files)}


def test_no_include_circle_in_the_c_kernels():
    graph = include_graph()
    assert any(graph.values()), "no includes found: the graph is broken"
    found = [{str(p.relative_to(PACKAGE.resolve())) for p in circle} for circle in circles(graph)]
    assert found == [], f"C files that include each other: {found}"
