"""The trainer's modules import each other in one direction only: no import cycle between
them, counting the imports inside functions (a lazy import is still a dependency), and each
layer imports only the layers below it (docs/trainer.md, "Layout"):

    data (loading) < models < parallel (pp too) < loop

with ``keys`` (wire names shared with Go) and ``timing`` (rank-local clocks) usable by all,
and one exception: the data layer reads the rank layout (``parallel.parallel_dims``)."""

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


LAYERS = ("data", "models", "parallel", "loop")
SHARED = {f"{ROOT}.keys", f"{ROOT}.timing"}
EXCEPTIONS = {("data", f"{ROOT}.parallel.parallel_dims")}


def layer(module: str) -> str:
    """The layer of a module: its subpackage, or "top" for the package's own modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in (*LAYERS, "integrations") else "top"


def violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for name, targets in sorted(graph.items()):
        own = layer(name)
        if own == "top":
            continue
        below = set(LAYERS[:LAYERS.index(own) + 1]) if own in LAYERS else {"data", "integrations"}
        for t in sorted(targets):
            ok = layer(t) in below or t in SHARED or (own, t) in EXCEPTIONS
            if not ok:
                out.append(f"{name} imports {t}")
    return out


def test_layers_import_only_lower_layers():
    assert violations(import_graph()) == []


def test_layer_violations_are_found():
    g = {f"{ROOT}.data.batches": {f"{ROOT}.models.losses", f"{ROOT}.keys"},
         f"{ROOT}.models.model": {f"{ROOT}.data.batches"}, f"{ROOT}.parallel.step": {f"{ROOT}.loop.common"},
         f"{ROOT}.data.datasets": {f"{ROOT}.parallel.parallel_dims"}, f"{ROOT}.stream": {f"{ROOT}.data.stream"},
         f"{ROOT}.data.sources": {f"{ROOT}.stream"}}
    assert violations(g) == [f"{ROOT}.data.batches imports {ROOT}.models.losses",
                             f"{ROOT}.data.sources imports {ROOT}.stream",
                             f"{ROOT}.parallel.step imports {ROOT}.loop.common"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
