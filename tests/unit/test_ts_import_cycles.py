"""The TypeScript sources of the sidebar import each other without a cycle (type imports included).

A cycle (``model.ts`` needing ``panel/workers.ts`` needing ``model.ts``) ties two modules so that
neither can be read, tested or moved alone; the shared types live in ``messages.ts``,
``sweep/rows.ts`` and the helpers in ``common/``.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "labextension" / "src"
RELATIVE_IMPORT = re.compile(r"""from\s+'(\.[^']*)'""")


def _imports() -> dict[Path, set[Path]]:
    graph: dict[Path, set[Path]] = {}
    for path in SRC.rglob("*.ts"):
        if "__tests__" in path.parts:
            continue
        deps = set()
        for spec in RELATIVE_IMPORT.findall(path.read_text()):
            target = (path.parent / spec).resolve()
            for candidate in (target.with_name(target.name + ".ts"), target / "index.ts"):
                if candidate.exists():
                    deps.add(candidate)
                    break
        graph[path.resolve()] = deps
    return graph


def _cycle(graph: dict[Path, set[Path]]) -> list[Path] | None:
    """One import cycle, or None (depth-first search with the path on the stack)."""
    done: set[Path] = set()

    def visit(node: Path, stack: list[Path]) -> list[Path] | None:
        for dep in sorted(graph.get(node, ())):
            if dep in stack:
                return stack[stack.index(dep) :] + [dep]
            if dep not in done:
                found = visit(dep, [*stack, dep])
                if found:
                    return found
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_labextension_sources_have_no_import_cycle():
    graph = _imports()
    assert len(graph) > 30  # the sources were found
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(str(p.relative_to(SRC)) for p in cycle)


def test_the_cycle_finder_finds_one():
    a, b, c = Path("a.ts"), Path("b.ts"), Path("c.ts")
    assert _cycle({a: {b}, b: {c}, c: {a}}) == [a, b, c, a]
    assert _cycle({a: {b}, b: {c}, c: set()}) is None
