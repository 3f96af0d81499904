"""The house reads top-down: the rules of docs/design.md ("Dependencies") checked on the imports
of src/kernelrpc, parsed with ast (nothing is imported). Every import counts, the ones inside
functions too; a module named in a string (a lazy table) counts as imported by the rules, not
for the cycles (the package's root names every part lazily, and they import its ``_load``).

The rules name today's packages. For a package added later: it falls under the rule of the
package it sits in (``runtime/graph_executor.py`` is the runtime's: the standard library, the
runtime and the stdlib-only modules below; never the compiler or ``relay/``); a new top-level
package joins the no-cycle rule at once and must not be imported by the wire or the runtime;
``relay/`` (a compiler front end) is kept out of the server and the runtime like the compiler.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "kernelrpc"

SERVICES = ("server", "tracker", "proxy")
CLIENT = "rpc"
WIRE = "wire"
#: What the wire may import: itself and the stdlib-only parts below it.
WIRE_MAY_IMPORT = {"wire", "errors", "netutil", "runtime"}
#: What the runtime (the code that runs on a device) may import: itself and stdlib-only modules.
RUNTIME_MAY_IMPORT = {"runtime", "errors", "display"}
COMPILERS = ("compiler", "relay")


def _module_name(path: pathlib.Path) -> str:
    parts = ["kernelrpc", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> tuple[set[str], set[str]]:
    """The kernelrpc modules ``name`` imports, and those it names in strings."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported, named = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                imported.add(submodule if submodule in MODULES else source)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value \
                and node.value in MODULES:
            named.add(node.value)
    return ({m for m in imported if m.split(".")[0] == "kernelrpc"}, named)


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def part(module: str) -> str:
    """The top-level part of kernelrpc a module belongs to: its package, or the module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kernelrpc"


def _arrows(strings: bool):
    for source, (imported, named) in IMPORTS.items():
        for target in imported | (named if strings else set()):
            yield source, target


def breaches(rule) -> list[str]:
    return sorted(f"{source} -> {target}" for source, target in _arrows(strings=True)
                  if part(source) != part(target) and not rule(part(source), part(target)))


def test_the_imports_are_read():
    """The rules below see real arrows (a parser that found none would pass them all)."""
    assert IMPORTS["kernelrpc.server.handler"][0] >= {"kernelrpc.wire.protocol", "kernelrpc.runtime.module"}
    assert "kernelrpc.rpc.client" in IMPORTS["kernelrpc.rpc"][1]


@pytest.mark.parametrize("service", SERVICES)
def test_no_service_imports_the_client(service):
    assert breaches(lambda source, target: not (source == service and target == CLIENT)) == []


def test_no_service_imports_another():
    """The server, the tracker and the proxy meet on the wire only (a limit two of them share,
    such as the tracker's MAX_PROTOCOL_CHARS, lives in the wire's codec)."""
    assert breaches(lambda source, target: not (source in SERVICES and target in SERVICES)) == []


def test_the_wire_imports_no_service_and_not_the_client():
    assert breaches(lambda source, target: source != WIRE or target in WIRE_MAY_IMPORT) == []


def test_the_runtime_imports_only_stdlib_only_modules():
    assert breaches(lambda source, target: source != "runtime" or target in RUNTIME_MAY_IMPORT) == []


@pytest.mark.parametrize("device_side", ("server", "runtime"))
def test_device_code_never_imports_a_compiler(device_side):
    assert breaches(lambda source, target: not (source == device_side and target in COMPILERS)) == []


def test_the_client_is_below_the_services_but_for_local_session():
    """The one arrow from the client into a service: TVM's rpc.LocalSession is the server's parts
    in this process (rpc/__init__.py imports it from server/local.py on first use)."""
    into_services = sorted((source, target) for source, target in _arrows(strings=True)
                           if part(source) == CLIENT and part(target) in SERVICES)
    assert into_services == [("kernelrpc.rpc", "kernelrpc.server.local")]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, or None."""
    state: dict[str, int] = {}   # 1: on the path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_cycle_between_the_parts():
    graph: dict[str, set[str]] = {}
    for source, target in _arrows(strings=False):
        if part(source) != part(target):
            graph.setdefault(part(source), set()).add(part(target))
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    assert {WIRE, "runtime"} <= graph["server"] and WIRE in graph[CLIENT]   # the arrows are there


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None
