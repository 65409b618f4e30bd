"""Explicit DAG workflows: every call and its dependencies given up front (``POST /v1/workflows``). The nodes
released by one completion form a stage; the remaining cost is the longest unreleased path (or a template's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.core.prefix import PrefixSeg
from gateway.core.workflow import CallSpec, CostFn, TemplateCursor, Workflow, WorkflowTemplate
from gateway.errors import DomainError


class DagError(DomainError, ValueError):
    """A node list is not a DAG (cycle, dangling or duplicate id); ``param`` names the field at fault
    (``calls``, ``calls.3.depends_on``) and the message starts with it (the live edge answers 422)."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param}: {problem}")
        self.param = param


@dataclass(frozen=True)
class DagCallSpec(CallSpec):
    """A call of a DAG workflow: the ``CallSpec`` plus the node's index (not slotted: compiled readers of
    ``CallSpec`` would not see a subclass's slots)."""

    node: int = -1


@dataclass(frozen=True, slots=True)
class DagNode:
    """One node as a client gives it: an id, the call's shape and the ids it depends on."""

    id: str
    kind: str
    input_tokens: int
    output_tokens: int
    depends_on: tuple[str, ...] = ()
    prefix: tuple[PrefixSeg, ...] = ()
    """The parts of the call's prompt other calls share (``CallSpec.prefix``)."""


Graph = tuple[tuple[int, ...], tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]
"""A node list's topological order, each node's dependencies (ascending) and its dependants, by index."""


def graph(nodes: Sequence[DagNode]) -> Graph:
    """The ``Graph`` of a node list; raises ``DagError`` on a problem."""
    index: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.id in index:
            raise DagError(f"calls.{i}.id", f"duplicate call id {n.id!r} (also calls.{index[n.id]})")
        index[n.id] = i
    deps: list[tuple[int, ...]] = []
    children: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for d in n.depends_on:
            if d == n.id:
                raise DagError(f"calls.{i}.depends_on", f"call {n.id!r} depends on itself")
            if d not in index:
                raise DagError(f"calls.{i}.depends_on", f"call {n.id!r} depends on unknown call {d!r}")
        deps.append(tuple(sorted({index[d] for d in n.depends_on})))
        for j in deps[-1]:
            children[j].append(i)
    indeg = [len(ds) for ds in deps]
    order = [i for i in range(len(nodes)) if indeg[i] == 0]
    head = 0
    while head < len(order):
        for c in children[order[head]]:
            indeg[c] -= 1
            if indeg[c] == 0:
                order.append(c)
        head += 1
    if len(order) < len(nodes):
        stuck = sorted(nodes[i].id for i in range(len(nodes)) if indeg[i] > 0)
        shown = ", ".join(repr(s) for s in stuck[:5]) + (", ..." if len(stuck) > 5 else "")
        raise DagError("calls", f"the dependencies form a cycle through {shown}")
    return tuple(order), tuple(deps), tuple(tuple(c) for c in children)


def validate_nodes(nodes: Sequence[DagNode]) -> None:
    """Raise ``DagError`` naming the first problem of a node list (empty, duplicate id, dangling, cycle)."""
    if not nodes:
        raise DagError("calls", "a workflow needs at least one call")
    graph(nodes)


_ONE_ORDER: tuple[int, ...] = (0,)
_ONE_DEPS: tuple[tuple[int, ...], ...] = ((),)
"""The topological order, dependencies and children of a one-node DAG (shared: tuples)."""


@dataclass(eq=False)
class DagWorkflow(Workflow):
    """A workflow given as a DAG of calls. Build with ``DagWorkflow.build`` (validates)."""

    nodes: tuple[DagNode, ...]
    template: WorkflowTemplate | None = None
    _order: tuple[int, ...] = field(default=(), repr=False)
    _deps: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    _children: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    _missing: list[int] = field(default_factory=list, repr=False)
    _released: list[bool] = field(default_factory=list, repr=False)
    _finished: int = field(default=0, repr=False)
    _started: bool = field(default=False, repr=False)
    _remaining_cache: tuple[object, int, float] | None = field(default=None, repr=False)
    _n_released: int = field(default=0, repr=False)

    @classmethod
    def build(
        cls,
        wid: int,
        tenant: str,
        arrival: float,
        deadline: float,
        nodes: Sequence[DagNode],
        template: WorkflowTemplate | None = None,
    ) -> DagWorkflow:
        """Validate ``nodes`` (raises ``DagError``) and build an unstarted workflow."""
        if not nodes:
            raise DagError("calls", "a workflow needs at least one call")
        wf = cls(wid, tenant, arrival, deadline, tuple(nodes), template)
        if len(nodes) == 1 and not nodes[0].depends_on:
            # One call (every chat completion): nothing to sort or index, the same workflow as below.
            wf._order, wf._deps, wf._children = _ONE_ORDER, _ONE_DEPS, _ONE_DEPS
        else:
            wf._order, wf._deps, wf._children = graph(nodes)
        wf._reset()
        return wf

    def _reset(self) -> None:
        self._missing = [len(d) for d in self._deps]
        self._released = [False] * len(self.nodes)
        self._finished = 0
        self._started = False
        self._cursor = TemplateCursor(self.template)
        self._remaining_cache = None
        self._n_released = 0

    def shifted(self, arrival: float, deadline: float) -> DagWorkflow:
        """An unstarted copy with new arrival and deadline times (validation is not repeated)."""
        wf = DagWorkflow(self.wid, self.tenant, arrival, deadline, self.nodes, self.template)
        wf._order, wf._deps, wf._children = self._order, self._deps, self._children
        wf._reset()
        return wf

    def spec(self, i: int) -> DagCallSpec:
        """The call spec of node ``i``."""
        n = self.nodes[i]
        return DagCallSpec(n.kind, n.input_tokens, n.output_tokens, n.prefix, node=i)

    def _release(self, ready: list[int]) -> list[CallSpec]:
        for i in ready:
            self._released[i] = True
        self._n_released += len(ready)
        if ready:
            self._cursor.enter(self.nodes[ready[0]].kind)
        return [self.spec(i) for i in ready]

    def start(self) -> list[CallSpec]:
        """The calls without dependencies."""
        if self._started:
            raise RuntimeError(f"workflow {self.wid} started twice")
        self._started = True
        return self._release([i for i in range(len(self.nodes)) if not self._deps[i]])

    def complete(self, spec: CallSpec) -> list[CallSpec]:
        """Node ``spec.node`` finished; release the nodes whose last dependency it was."""
        if not isinstance(spec, DagCallSpec) or not 0 <= spec.node < len(self.nodes):
            raise RuntimeError(f"workflow {self.wid}: completion of a call that is not one of its nodes")
        i = spec.node
        if not self._released[i] or self._missing[i] < 0:
            raise RuntimeError(f"workflow {self.wid}: node {self.nodes[i].id!r} completed twice or before release")
        self._missing[i] = -1
        self._finished += 1
        ready: list[int] = []
        for c in self._children[i]:
            self._missing[c] -= 1
            if self._missing[c] == 0:
                ready.append(c)
        return self._release(ready)

    @property
    def done(self) -> bool:
        """True once every node has finished."""
        return self._started and self._finished == len(self.nodes)

    @property
    def num_calls(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    def expected_remaining(self, cost: CostFn) -> float:
        """Expected cost after the current stage: the template's, or the DAG's unreleased critical path."""
        if self.template is not None:
            return self._cursor.remaining(cost)
        cached = self._remaining_cache
        if cached is not None and cached[0] is cost and cached[1] == self._n_released:
            return cached[2]
        longest = [0.0] * len(self.nodes)
        best = 0.0
        for i in reversed(self._order):
            if self._released[i]:
                continue
            n = self.nodes[i]
            tail = max((longest[c] for c in self._children[i]), default=0.0)
            longest[i] = cost(n.kind, n.input_tokens, n.output_tokens) + tail
            best = max(best, longest[i])
        self._remaining_cache = (cost, self._n_released, best)
        return best


def chain_nodes(stages: Sequence[Sequence[CallSpec]], prefix: str = "c") -> list[DagNode]:
    """DAG nodes for a chain of stages: every call of stage k depends on every call of stage k-1."""
    out: list[DagNode] = []
    prev: tuple[str, ...] = ()
    for k, stage in enumerate(stages):
        ids = tuple(f"{prefix}{k}.{j}" for j in range(len(stage)))
        out.extend(
            DagNode(ids[j], s.kind, s.input_tokens, s.output_tokens, prev, s.prefix) for j, s in enumerate(stage)
        )
        prev = ids
    return out
