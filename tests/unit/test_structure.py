"""The project's imports form no cycle: every import statement counts, at module level, inside a function (lazy) or
under TYPE_CHECKING, because each of them is a dependency a reader has to follow (docs/architecture.md, "Code
layout": nothing imports upwards)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# where each importable name lives: the package, the Airflow plugins, the DAG files
SOURCES = {"spark_jobs": ROOT / "spark_jobs", "cdc_airflow": ROOT / "plugins" / "cdc_airflow"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = (package, *path.relative_to(folder).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in [*(ROOT / "plugins").glob("*.py"), *(ROOT / "dags").glob("*.py")]:
        found[path.stem] = path
    return found


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project's modules it imports, by any import statement anywhere in it."""
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package upwards
                    base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
                targets |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
        graph[name] = {_owner(t, known) for t in targets} - {None, name}  # type: ignore[misc]
    return graph


def _owner(target: str, known: dict[str, Path]) -> str | None:
    """The project module an imported name belongs to (a name imported from a module is that module)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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


def test_no_import_cycle_lazy_or_type_only_imports_included():
    graph = import_graph(modules())
    assert "spark_jobs.cli" in graph and "cdc_airflow.operators" in graph and "cdc_layers" in graph
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        " <-> ".join(c) + "\n" + "\n".join(f"    {m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found)


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import(tmp_path):
    """The check above cannot pass by missing one: two modules importing each other, one of them inside a
    function, and a third importing one of them, give exactly the two."""
    (tmp_path / "a.py").write_text("from b import thing\n")
    (tmp_path / "b.py").write_text("def thing():\n    from a import other\n")
    (tmp_path / "c.py").write_text("import a\n")
    known = {path.stem: path for path in tmp_path.glob("*.py")}
    assert cycles(import_graph(known)) == [["a", "b"]]
