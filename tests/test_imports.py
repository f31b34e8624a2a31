"""core/ is pure Python: importing the scheduler (or anything in core/) loads no torch,
transformers or tqdm — also not through the package's __init__. Checked in a fresh
interpreter, since this test process has long imported them. And the package's modules import
each other without a circle: config.py sits below the engine and the policies."""

import ast
import subprocess
import sys
from pathlib import Path

import minivllm

HEAVY = ("torch", "transformers", "tqdm", "numpy")


def test_core_imports_no_torch():
    code = ("import sys, minivllm.core.scheduler, minivllm.core.policy, minivllm.core.kv_cache, "
            "minivllm.core.request, minivllm.core.scheduler_output, minivllm.core.router, "
            "minivllm.sampling_params, minivllm.config; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_package_names_still_import_lazily():
    code = "import minivllm; print(minivllm.SamplingParams.__name__, minivllm.LLM.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["SamplingParams", "LLM"], result.stderr


PACKAGE = Path(minivllm.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports, by every import statement in it: one
    deferred into a function body is a dependency all the same."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}

    def resolve(name: str) -> str | None:  # the module itself, else the package holding it
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {resolve(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package this module is in
                    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}".rstrip(".")
                targets |= {resolve(f"{base}.{alias.name}") for alias in node.names}
        graph[name] = targets - {None, name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while not component or module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                circles.append(component)

    for module in graph:
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle_in_the_package():
    circles = import_circles(import_graph())
    assert circles == [], f"modules that import each other: {circles}"


def test_the_circle_finder_finds_a_deferred_import_back():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [{"a", "b", "c"}]


def test_config_imports_nothing_from_the_engine_or_the_policies():
    """config.py is read by everything below the entrypoints: it may import core/'s
    registries and configs, not the engine or the policy classes (each policy checks its own
    options, found through core/policy.py's registry)."""
    imported = import_graph()["minivllm.config"]
    assert imported, "no imports found: the graph is broken"
    assert not [m for m in imported
                if m.startswith(("minivllm.engine", "minivllm.core.policies"))], imported
