"""The package's layout: imports run one way, with no circles, and tools stay out of the chapters."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_ref"
# Subpackages that are tools beside the chapters: only they (and the demo) may import them.
TOOLS = ("bench", "training", "notebook")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every specdec_ref module `path` imports, at the top, inside functions or under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("specdec_ref"):
                found.add(module)
                found |= {f"{module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("specdec_ref")}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    # An import of a name inside a module points at the module; of a package, at its __init__.
    return {name: {m for m in _imports(path, name) if m in modules and m != name}
            for name, path in modules.items()}


def test_imports_have_no_circles():
    """The import graph of specdec_ref, lazy and TYPE_CHECKING imports included, is acyclic."""
    graph = _graph()
    assert len(graph) > 20  # the walk found the package's modules
    state: dict[str, str] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_chapter_modules_never_import_the_tools():
    """The chapters' modules import neither the benchmark, the training recipe nor the notebook helpers."""
    for name, targets in _graph().items():
        parts = name.split(".")
        if len(parts) > 1 and parts[1] in TOOLS or name == "specdec_ref.__main__":
            continue
        for target in targets:
            assert target.split(".")[1:2] not in [[tool] for tool in TOOLS], f"{name} imports {target}"


def fast_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Per chapter module (not a tool, not `fast` itself, not the demo), what it imports of `fast`."""
    found = {}
    for name, targets in graph.items():
        part = name.split(".")[1:2]
        if part and part[0] in (*TOOLS, "fast", "__main__"):
            continue
        fast = {t for t in targets if t.split(".")[1:2] == ["fast"]}
        if fast:
            found[name] = fast
    return found


def test_no_chapter_module_imports_fast():
    """No chapter module imports `fast` (fast/__init__.py); the tree decoder takes its
    fast sources through `tree_forward.TreeLogitsSource`."""
    found = fast_imports(_graph())
    assert found == {}, found
    # The check can fail: a decoder importing fast.static would be listed.
    assert fast_imports({"specdec_ref.decoder": {"specdec_ref.fast.static"}}) == {
        "specdec_ref.decoder": {"specdec_ref.fast.static"}}


def test_a_circle_would_be_found(monkeypatch):
    """The circle check can fail: a graph with a back edge raises."""
    import test_layout

    monkeypatch.setattr(test_layout, "_graph", lambda: {**{f"m{i}": set() for i in range(21)},
                                                        "a": {"b"}, "b": {"c"}, "c": {"a"}})
    try:
        test_layout.test_imports_have_no_circles()
    except AssertionError as error:
        assert "a -> b -> c -> a" in str(error)
    else:
        raise AssertionError("the circle a -> b -> c -> a was not found")


HANG_GUARD = 1200  # seconds: the least a test's wall-clock limit may be


def test_wall_clock_limits_in_tests_only_guard_hangs():
    """No test fails because the machine is slow: every `timeout=` in tests/ is at least
    HANG_GUARD seconds, a guard against a hang, never a performance target."""
    tight = []
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "timeout":
                value = node.value
                if not (isinstance(value, ast.Constant) and isinstance(value.value, (int, float))
                        and value.value >= HANG_GUARD):
                    tight.append(f"{path.name}:{node.lineno}: timeout={ast.unparse(value)}")
    assert not tight, f"limits under {HANG_GUARD} s (or not literal): {tight}"
