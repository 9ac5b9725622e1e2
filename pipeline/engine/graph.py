"""From a recipe to the DAG of stage runs (nodes), each declared by its inputs and config.

A node is one artifact to build: its stage says which code runs, its config is exactly what that
code reads, and its inputs name the upstream nodes. Fingerprints follow from these. Each stage
plans its own nodes (its declaration's `plan`, pipeline/engine/stage.py), in the registry's order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from .code_digest import combined, stage_code
from .errors import RecipeError, UserInputError
from .stage import Node, Planner, Stage
from .store import fingerprint


def build_graph(
    recipe: Any, recipe_path: str | Path, stages: Sequence[Stage], machine: dict | None = None
) -> list[Node]:
    """All nodes the recipe asks for, in topological order, with fingerprints set.

    `machine` (cpu, gpu) enters the fingerprints of machine-dependent stages (benchmark, GPU-only
    evaluations) so that their numbers are never reused on another kind of machine.
    """
    planner = Planner(recipe, str(recipe_path), machine)
    for stage in stages:
        planner.stage = stage
        stage.plan(planner)
    nodes = _in_order(planner.nodes)
    _check_and_fingerprint(nodes, planner.where)
    return nodes


def _in_order(nodes: list[Node]) -> list[Node]:
    """The nodes in the order the stages planned them, each after the nodes it reads."""
    by_name = {n.name: n for n in nodes}
    out: list[Node] = []
    done: set[str] = set()

    def visit(node: Node) -> None:
        if node.name in done:
            return
        done.add(node.name)
        for upstream in node.inputs.values():
            if upstream in by_name:
                visit(by_name[upstream])
        out.append(node)

    for node in nodes:
        visit(node)
    return out


def _check_and_fingerprint(nodes: list[Node], where: str) -> None:
    by_name: dict[str, Node] = {}
    for node in nodes:
        problems = node.spec.inputs.problems(list(node.inputs))
        if problems:
            raise RecipeError([f"{where}: internal: {node.name}: {p}" for p in problems])
        for upstream in node.inputs.values():
            if upstream not in by_name:
                raise RecipeError([f"{where}: {node.name}: needs '{upstream}', which this recipe does not build"])
        _set_fingerprint(node, by_name)
        by_name[node.name] = node


def _set_fingerprint(node: Node, by_name: dict[str, Node]) -> None:
    node.code = {**stage_code(node.spec.declaration), **stage_code(node.spec.build)}
    node.fingerprint = fingerprint(
        node.name,
        node.spec.version,
        combined(node.code),
        node.config,
        {role: by_name[up].input_key for role, up in node.inputs.items()},
    )


def resolve_builds(
    nodes: list[Node], current_build: Callable[[str], str], rebuild: Callable[[Node], str | None] = lambda node: None
) -> None:
    """Point each node at the build of its fingerprint that the store holds now.

    A forced rebuild never overwrites an artifact: it is written under an id of its own and the
    store remembers it as the current build of that fingerprint (`current_build`: default id ->
    current id). Dependants then take the rebuild's id into their fingerprints, so nothing built
    from the earlier build is reused with the new one. `rebuild(node)` gives the id for a node
    this run rebuilds (None: keep the current one), called after its inputs are resolved."""
    by_name: dict[str, Node] = {}
    for node in nodes:  # topological order
        _set_fingerprint(node, by_name)
        current = current_build(node.default_id)
        node.build = "" if current == node.default_id else current  # rebuild(node) reads node.id
        node.build = rebuild(node) or node.build
        by_name[node.name] = node


def select(nodes: list[Node], until: str | None) -> list[Node]:
    """`until` a node name (`evaluate.teacher`) or a stage kind/prefix (`evaluate`): those nodes
    and everything they depend on."""
    if until is None:
        return list(nodes)
    targets = [n for n in nodes if n.name == until or n.stage == until or n.name.startswith(until + ".")]
    if not targets:
        names = ", ".join(dict.fromkeys([n.name.split(".")[0] for n in nodes] + [n.name for n in nodes]))
        raise UserInputError(f"--until {until}: no such stage in this recipe (stages: {names})")
    by_name = {n.name: n for n in nodes}
    wanted: set[str] = set()
    stack = [t.name for t in targets]
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend(by_name[name].inputs.values())
    return [n for n in nodes if n.name in wanted]
