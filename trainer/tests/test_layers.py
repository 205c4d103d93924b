"""The trainer's modules import each other in one direction only: no import cycle between
them, counting the imports inside functions (a lazy import is still a dependency)."""

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mmfeed_trainer")
ROOT = "mmfeed_trainer"


def modules() -> dict[str, str]:
    """Module name -> file, for every module of the package (subpackages too)."""
    out = {}
    for d, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = os.path.join(d, f)
    return out


def _target(mods: dict[str, str], name: str, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    base = name.split(".")
    if not mods[name].endswith("__init__.py"):
        base = base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its file."""
    mods = modules()
    graph = {m: set() for m in mods}
    for name, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _target(mods, name, node)
                if not target or not target.startswith(ROOT):
                    continue
                subs = {f"{target}.{a.name}" for a in node.names} & mods.keys()
                graph[name] |= subs or ({target} & mods.keys())
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names} & mods.keys()
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
