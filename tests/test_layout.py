"""The layout rules of ``docs/architecture.md``, checked by reading the code:

- the pure modules import without Django (in a fresh interpreter with no settings);
- one dependency direction between the apps: ``reviews``, ``mcp_gateway`` and ``demo`` import
  ``callgate``, ``callgate`` imports nothing of ``reviews`` but ``reviews.models``, nothing
  imports ``demo`` or ``mcp_gateway``;
- no import cycle among the project's modules, function-level imports included (a
  function-level import may defer loading, never hide a cycle);
- no test module imports another test module.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("callgate", "reviews", "demo", "mcp_gateway", "sdk/callgate_sdk")
PURE = (
    "callgate_sdk",
    "callgate_sdk.wire",
    "callgate_sdk.providers",
    "callgate.taxonomy",
    "callgate.classification",
    "callgate.lifecycle",
    "callgate.lint",
    "callgate.schemas",
    "callgate.timeparse",
    "callgate.queues",
    "callgate.search",
)


def _module_name(path: Path, base: Path = ROOT) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(*tops: str) -> dict[str, Path]:
    found = {}
    for top in tops:  # "sdk/callgate_sdk": the package callgate_sdk under sdk/
        package = ROOT / top
        for path in package.rglob("*.py"):
            if "migrations" not in path.parts:
                found[_module_name(path, package.parent)] = path
    return found


def _imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, at any depth of the file, resolved to absolute names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {
        name: {target for target in _imports(path, name) if target in modules and target != name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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


def test_the_pure_modules_import_without_django():
    code = (
        "import sys\n"
        f"for name in {PURE!r}:\n"
        "    __import__(name)\n"
        "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"the pure modules pulled in Django: {done.stdout}"


def test_the_apps_depend_in_one_direction():
    graph = _graph(_sources(*APPS))
    wrong = []
    for module, targets in graph.items():
        for target in targets:
            app, other = module.split(".")[0], target.split(".")[0]
            if app == "callgate" and other == "reviews" and target != "reviews.models":
                wrong.append(f"{module} -> {target} (callgate may use only reviews.models)")
            if app != "mcp_gateway" and other == "mcp_gateway":
                wrong.append(f"{module} -> {target} (the MCP gateway is built on callgate, not in)")
            if app != "demo" and other == "demo":
                wrong.append(f"{module} -> {target} (nothing in the product imports the demo)")
            if app == "callgate_sdk" and other != "callgate_sdk":
                wrong.append(f"{module} -> {target} (the SDK stands alone; the server imports it)")
    assert wrong == []


def test_no_import_cycle_among_the_project_modules():
    assert _cycles(_graph(_sources(*APPS))) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_test_module_imports_another():
    tests = _sources("tests")
    graph = _graph(tests)
    wrong = [
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if Path(tests[target]).name.startswith("test_")
    ]
    assert wrong == []
