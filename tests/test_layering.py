"""The package's import graph: no cycles, no import from a lower floor to a higher one, and
the finer rules within floors.

The graph is read with ``ast`` from the source (imports inside functions count, so a lazy
import cannot hide a dependency). Importing ``a.b.c`` also imports the packages ``a`` and
``a.b``, so those edges count too, except where they are the importing module's own parents:
those are already being imported when it runs. A module that names its own parent package
(``from a.b import name`` inside ``a.b.c``) needs that package's ``__init__`` to have run, so
that edge counts, and ``a.b`` importing ``a.b.c`` back is a cycle. Floors, bottom up
(`FLOORS`)::

    extras, listen  <-  sandbox  <-  webshop  <-  envs  <-  worker  <-  backends  <-  pool
             <-  policies  <-  rollout  <-  serve, integrations, view  <-  ragen  <-  cli, bench

(``extras`` and ``listen`` import nothing of turnpool; every floor may import them.)

A module may import its own floor and the floors below, never one above. ``turnpool/__init__.py``
imports the env core (``envs.base``, ``envs.registry``) and names its other public objects as
strings (imported on first use), so its only edges reach the env floor.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

import turnpool

ROOT = Path(turnpool.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(source: str, module: str) -> Iterator[str]:
    """The turnpool module each import statement of ``source`` names (the deepest one that
    exists): ``from pkg import name`` names ``pkg.name`` when that is a module, else ``pkg``."""
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        for name in names:
            if not name.startswith("turnpool"):
                continue
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            yield name


def _edges(module: str, named: Iterable[str]) -> set[str]:
    """What importing ``module`` imports directly, given the modules its imports name.

    Naming ``a.b.c`` imports ``a`` and ``a.b`` first. Those implied parents are left out
    where they are ``module``'s own parents (already importing when ``module`` runs); a parent
    that an import names itself is kept: it needs that package's ``__init__`` to have run."""
    own = module.split(".")
    parents = {".".join(own[:k]) for k in range(1, len(own))}
    edges: set[str] = set()
    for name in named:
        parts = name.split(".")
        implied = {".".join(parts[:k]) for k in range(1, len(parts))}
        edges |= (implied - parents) | {name}
    return edges - {module}


def _graph() -> dict[str, set[str]]:
    return {module: _edges(module, _imports(path.read_text(encoding="utf-8"), module))
            for module, path in MODULES.items()}


GRAPH = _graph()


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _in(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_graph_is_read() -> None:
    """The reader sees the package: the core modules and their best-known edges."""
    for name in ("turnpool.envs.base", "turnpool.pool.api", "turnpool.backends.base",
                 "turnpool.rollout.collector", "turnpool.ragen.config"):
        assert name in MODULES, name
    assert "turnpool.envs.base" in GRAPH["turnpool.envs.registry"]
    assert "turnpool.worker.protocol" in GRAPH["turnpool.worker.host"]


def test_no_import_cycles() -> None:
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or [])


def test_cycle_finder_finds_a_cycle() -> None:
    """The checker itself fails on a cycle (guards against a checker that sees nothing)."""
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["turnpool.envs.base"].add("turnpool.pool.api")
    assert _cycle(graph) is not None


def test_a_module_importing_its_own_parent_package_that_imports_it_back_is_a_cycle() -> None:
    """A planted pair: ``pool/__init__`` imports ``pool.api`` and ``pool.api`` takes a name
    from ``turnpool.pool`` (absolutely or as ``from . import``): both spellings close a
    cycle, while ``pool.api`` importing a sibling adds no edge to its own package."""
    package = _edges("turnpool.pool", _imports("from turnpool.pool.api import EnvPool\n",
                                                "turnpool.pool"))
    assert package == {"turnpool.pool.api"}
    sibling = _edges("turnpool.pool.api",
                     _imports("from turnpool.pool.dispatch import Dispatcher\n",
                              "turnpool.pool.api"))
    assert sibling == {"turnpool.pool.dispatch"}
    assert _cycle({"turnpool.pool": package, "turnpool.pool.api": sibling}) is None
    for source in ("from turnpool.pool import helper\n", "from . import helper\n",
                   "import turnpool.pool\n"):
        parent = _edges("turnpool.pool.api", _imports(source, "turnpool.pool.api"))
        assert parent == {"turnpool.pool"}, source
        found = _cycle({"turnpool.pool": package, "turnpool.pool.api": parent})
        assert found == ["turnpool.pool", "turnpool.pool.api", "turnpool.pool"], source


#: The floors, bottom up: a module imports only from its own floor and those below.
FLOORS: list[tuple[str, ...]] = [
    ("turnpool.extras", "turnpool.listen"),  # one-line import errors; sockets: import nothing
    ("turnpool.sandbox",),           # runs untrusted programs; imports nothing of turnpool
    ("turnpool.webshop",),           # the shop the WebShop env talks to
    ("turnpool.envs",),
    ("turnpool.worker",),            # protocol, host, deadline, transport: the worker's side
    ("turnpool.backends",),          # where envs run
    ("turnpool.pool",),              # what runs: EnvPool, dispatch, replay, slots
    ("turnpool.policies",),
    ("turnpool.rollout",),
    ("turnpool.serve", "turnpool.integrations", "turnpool.view"),
    ("turnpool.ragen",),
    ("turnpool.cli", "turnpool.bench"),
]


def _floor(module: str) -> int | None:
    for rank, prefixes in enumerate(FLOORS):
        if _in(module, *prefixes):
            return rank
    return None


#: module (prefix) -> what it may import: ``"a.b"`` is that module (or package) only,
#: ``"a.b.*"`` is it and everything below it. The first matching rule wins.
#: What the floors above the pool may read of the worker: the protocol and its records
WORKER_FACE = ("turnpool.worker.protocol", "turnpool.worker.failures", "turnpool.worker.results",
               "turnpool.worker.errors", "turnpool.worker.defaults",
               "turnpool.worker.children")  # how serve's fronts start, as workers do
ALLOWED: list[tuple[str, tuple[str, ...]]] = [
    ("turnpool.extras", ()),
    ("turnpool.listen", ()),
    ("turnpool.sandbox", ("turnpool.sandbox.*",)),
    ("turnpool.webshop", ("turnpool.webshop.*",)),
    ("turnpool.envs", ("turnpool.envs.*", "turnpool.webshop.*", "turnpool.sandbox.*")),
    ("turnpool.worker", ("turnpool.envs.*", "turnpool.worker.*", "turnpool.sandbox.*")),
    ("turnpool.backends", ("turnpool.envs.*", "turnpool.worker.*", "turnpool.backends.*")),
    # the pool reaches backends only through the registry and the protocol
    ("turnpool.pool", ("turnpool.envs.*", "turnpool.worker.*", "turnpool.backends",
                       "turnpool.backends.base", "turnpool.pool.*")),
    ("turnpool.policies", ("turnpool.envs.*", "turnpool.policies.*")),
    ("turnpool.rollout.settings", ()),
    ("turnpool.rollout", ("turnpool.envs.*", "turnpool.pool.*", "turnpool.worker",
                          *WORKER_FACE, "turnpool.policies.*",
                          "turnpool.rollout.*")),
    # the OpenEnv server: a pool behind a wire protocol
    ("turnpool.serve", ("turnpool", "turnpool.envs.*", "turnpool.pool.*", "turnpool.worker",
                        *WORKER_FACE, "turnpool.rollout",
                        "turnpool.rollout.prompts", "turnpool.serve.*")),
    # the viewer: reads what rollout writes, draws boards with the envs, replays records
    ("turnpool.view", ("turnpool.envs.*", "turnpool.rollout.*", "turnpool.view.*")),
    ("turnpool.integrations", ("turnpool.envs.*", "turnpool.pool.*", "turnpool.worker",
                               *WORKER_FACE, "turnpool.policies.*",
                               "turnpool.rollout.*", "turnpool.integrations.*")),
]


#: Modules every floor may import (they import nothing of turnpool themselves).
EVERYWHERE = ("turnpool.extras", "turnpool.listen")


def _allows(allowed: tuple[str, ...], target: str) -> bool:
    if target in EVERYWHERE:
        return True
    for rule in allowed:
        if rule.endswith(".*") and _in(target, rule[:-2]):
            return True
        if target == rule:
            return True
    return False


def _rule(module: str) -> tuple[str, ...] | None:
    for prefix, allowed in ALLOWED:
        if _in(module, prefix):
            return allowed
    return None


def _upward(module: str, target: str) -> bool:
    low, high = _floor(module), _floor(target)
    return low is not None and high is not None and high > low


def test_every_module_is_on_a_floor() -> None:
    assert not [m for m in MODULES if m != "turnpool" and _floor(m) is None]


def test_floors_reject_what_they_should() -> None:
    """The floor check itself fails on an upward arrow (guards against a check that sees
    nothing): the worker floor never reaches the pool or a backend, backends never the pool,
    and pool and backends never import each other both ways."""
    assert _upward("turnpool.worker.host", "turnpool.pool.api")
    assert _upward("turnpool.worker.protocol", "turnpool.backends.base")
    assert _upward("turnpool.backends.process", "turnpool.pool")
    assert _upward("turnpool.envs.sokoban", "turnpool.worker.protocol")
    assert not _upward("turnpool.pool.api", "turnpool.backends")
    assert not _upward("turnpool.pool.slots", "turnpool.pool.api")
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["turnpool.worker.host"].add("turnpool.pool.dispatch")
    assert [m for m, ts in graph.items() for t in ts if _upward(m, t)] == [
        "turnpool.worker.host"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_reaches_a_higher_floor(module: str) -> None:
    wrong = sorted(t for t in GRAPH[module] if _upward(module, t))
    assert not wrong, f"{module} (floor {_floor(module)}) imports higher floors: {wrong}"


def test_rules_reject_what_they_should() -> None:
    assert not _allows(_rule("turnpool.backends.process") or (), "turnpool.pool.api")
    assert not _allows(_rule("turnpool.pool.api") or (), "turnpool.backends.process")
    assert not _allows(_rule("turnpool.envs.sokoban") or (), "turnpool.pool")
    assert _allows(_rule("turnpool.pool.api") or (), "turnpool.backends")
    assert not _allows(_rule("turnpool.rollout.collector") or (), "turnpool.integrations.trl")
    assert not _allows(_rule("turnpool.integrations.trl") or (), "turnpool.ragen.config")
    assert not _allows(_rule("turnpool.integrations.verl") or (), "turnpool.backends.process")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module: str) -> None:
    targets = GRAPH[module] - {"turnpool"}
    allowed = _rule(module)
    if allowed is not None:
        wrong = sorted(t for t in targets if not _allows(allowed, t))
        assert not wrong, f"{module} imports {wrong} against the layering"
    # bench/ measures the facades too (the RAGEN facade's start), as a consumer like cli/
    if not _in(module, "turnpool.ragen", "turnpool.cli", "turnpool.bench"):
        wrong = sorted(t for t in targets if _in(t, "turnpool.ragen"))
        assert not wrong, (f"{module} imports the RAGEN facades {wrong}; only ragen/, cli/, "
                           f"bench/ may")


def test_pool_reaches_backends_only_through_the_registry() -> None:
    for module in MODULES:
        if _in(module, "turnpool.pool"):
            concrete = [t for t in GRAPH[module] if _in(t, "turnpool.backends")
                        and t not in ("turnpool.backends", "turnpool.backends.base")]
            assert not concrete, f"{module} imports concrete backends {concrete}"


def test_rollout_never_imports_a_backend() -> None:
    for module in MODULES:
        if _in(module, "turnpool.rollout"):
            assert not any(_in(t, "turnpool.backends") for t in GRAPH[module]), module
