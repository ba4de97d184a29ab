"""Sub-sequence matching of rule patterns against extracted structure, along data flow.

A pattern's steps must be found in execution order, each consuming what the previous one
produced where the pattern says so (``-> $h`` then ``f($h)``), on one feasible execution path.
A ``$module`` callee ties a ``forward`` step to the ``__init__`` construction of the attribute it
calls (scope analysis): the construction must match the rule's ``init`` pattern for that variable.
A match whose intermediate value is also used elsewhere on the same path is kept, but marked not
applicable: fusing it would remove a value the rest of the code still reads.

Rules are indexed by the callee of their first step, so adding rules adds no per-rule pass over
the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from ..dsl.syntax import (
    DETECT_ONLY,
    Attribute,
    Call,
    Expr,
    Index,
    Keyword,
    Literal,
    Name,
    Positional,
    Rest,
    Rule,
    Step,
    Var,
    Wildcard,
)
from ..extract.model import (
    EMPTY_CONTEXT,
    Construction,
    Context,
    FileStructure,
    Flow,
    FunctionFlow,
    Operand,
    Reciprocal,
    Use,
    consistent,
)
from ..extract.model import Step as FlowStep
from ..extract.names import dotted_suffix_match, parameter_names, step_family
from .calls import match_calls
from .explain import (
    NO_START,
    Miss,
    call_text,
    callee_distance,
    callee_text,
    describe_construction,
    describe_value,
    numbered,
    owner,
)

MAX_CANDIDATES = 2000  # per pattern step, a guard against pathological files
# Matches of one start on other paths kept for a rewrite across the arms of a branch (an
# ``if``/``elif`` chain of this many arms is far beyond real attention code).
MAX_ALTERNATIVES = 8
# Calls whose last two positional arguments name two dimensions in either order.
_SWAPPABLE_DIMS = frozenset(
    ["Tensor.transpose", "torch.transpose", "Tensor.swapaxes", "torch.swapaxes"]
)


@dataclass
class Site:
    """One place where a rule applies (or would, but for another use of a fused value)."""

    rule: Rule
    path: str
    line: int
    column: int
    cls: str | None
    method: str
    applicable: bool = True
    reason: str = ""
    steps: list[FlowStep] = field(default_factory=list)
    where_steps: list[FlowStep] = field(default_factory=list)
    constructions: dict[str, Construction] = field(default_factory=dict)
    bindings: dict[str, object] = field(default_factory=dict)
    flow: FunctionFlow | None = None
    notes: list[str] = field(default_factory=list)
    instances: list[Site] = field(default_factory=list)  # the same site through other calls
    # The same start matched on paths that exclude this one's (the key and value projections
    # of another arm of an ``if``/``elif`` chain): what a rewrite that copies the shared
    # statement into every arm (paper Fig. 4) fuses in those arms. Never reported as sites.
    alternatives: list[Site] = field(default_factory=list)
    swapped: tuple[int, ...] = ()  # ids of matched add/mul steps read with operands swapped
    # The character column of ``container_call()``, set where the file's text is known.
    call_column: int | None = None
    # Set by a scan that also plans the rewrite (the CLI's): ``apply`` would skip this site,
    # for this reason, given by the same named check that apply's skip gives.
    rewritable: bool = True
    rewrite_reason: str = ""
    # The call a call-site rule matched (``Rule.call``); ``None`` for the rules of the DSL.
    call: ast.Call | None = None

    def container_call(self) -> ast.Call | None:
        """The ``nn.Sequential`` call in ``forward`` that a match through the container's
        elements edits (the site itself is located at the element, often in a factory)."""
        first = self.steps[0] if self.steps else None
        if first is not None and first.synthetic and isinstance(first.node, ast.Call):
            return first.node
        return None

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.rule.id, self.path, self.line, self.column)

    @property
    def message(self) -> str:
        return self.rule.message or self.rule.description or self.rule.name

    def as_record(self) -> dict[str, object]:
        record: dict[str, object] = {
            "rule": self.rule.id,
            "name": self.rule.name,
            "path": self.path,
            "line": self.line,
            "col": self.column,
            "class": self.cls,
            "method": self.method,
            "message": self.message,
        }
        if self.rule.kernel:
            record["kernel"] = self.rule.kernel
        if self.rule.third_party_kernel:  # not one of adopter.kernels: the user's to trust
            record["third_party"] = True
        if not self.applicable:
            record["applicable"] = False
            record["reason"] = self.reason
        elif not self.rewritable:
            record["rewritable"] = False
            record["rewrite_reason"] = self.rewrite_reason
        return record


@dataclass(frozen=True)
class BoundOutput:
    """A pattern variable bound to a value produced by a matched step."""

    value: int
    step: FlowStep


@dataclass(frozen=True)
class BoundModule:
    """A pattern variable bound to a submodule (``self.dense``)."""

    path: str
    construction: Construction


@dataclass
class _State:
    bindings: dict[str, object]
    steps: list[FlowStep]
    context: Context
    constructions: dict[str, Construction]
    notes: tuple[str, ...] = ()
    swapped: tuple[int, ...] = ()  # steps whose two operands matched in the other order
    # while matching ``where`` steps: a matched value and the values derived from it by
    # elementwise scaling or casts (``q_proj(h) * self.scaling``), which count as it
    through: dict[int, frozenset[int]] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(
            dict(self.bindings),
            list(self.steps),
            self.context,
            dict(self.constructions),
            self.notes,
            self.swapped,
            self.through,
        )


class CompiledRule:
    """A rule prepared for matching: init patterns keyed by the variable they bind."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.forward: tuple[Step, ...] = rule.forward.steps if rule.forward else ()
        self.where: tuple[Step, ...] = rule.forward.where if rule.forward else ()
        self.init_by_var: dict[str, Step] = {}
        if rule.init:
            for step in rule.init.steps:
                for target in step.targets:
                    self.init_by_var[target.name] = step
        replacement = rule.forward.replacement if rule.forward else None
        kept: set[str] = set()
        if isinstance(replacement, tuple):
            kept = {t.name for step in replacement for t in step.targets}
        final = {t.name for t in self.forward[-1].targets} if self.forward else set()
        self.intermediates = [
            t.name
            for step in self.forward
            for t in step.targets
            if t.name not in kept
            and (replacement not in (None, DETECT_ONLY) or t.name not in final)
        ]
        # The operations every match calls by name, and the classes of the submodules it
        # calls: a flow without a step of each cannot match, and is not searched (see
        # Matcher._could_match).
        self.required_names = tuple(
            dict.fromkeys(
                name for step in self.forward if (name := self._required_name(step)) is not None
            )
        )

    def _required_name(self, step: Step) -> str | None:
        """The kind a flow step must have for ``step`` to match it: the operation it names,
        or for a submodule call (``$proj(x)``) the class its ``init`` pattern constructs."""
        if isinstance(step.callee, Var):
            init = self.init_by_var.get(step.callee.name)
            return _callee_name(init.callee) if init is not None else None
        return _callee_name(step.callee)

    @property
    def first(self) -> Step | None:
        return self.forward[0] if self.forward else None


class Matcher:
    """Matches a rule set against extracted files."""

    def __init__(self, rules: list[Rule], *, explain: bool = False) -> None:
        self.rules = [
            CompiledRule(spelling)
            for rule in rules
            if rule.call is None
            for spelling in rule.spellings
        ]
        # Call-site rules (training code: optimizer construction) look at every call of a file.
        self.call_rules = [rule for rule in rules if rule.call is not None]
        self._kind_cache: dict[tuple[str, str], bool] = {}
        # The match trace (``scan --explain``): the candidates of the last ``match_file`` where
        # a rule did not fire. ``_reason`` is why the last unification failed, ``_deepest`` the
        # furthest pattern step one candidate's search reached: (depth, priority, step, reason).
        self.explain = explain
        self.misses: list[Miss] = []
        self._reason = ""
        self._deepest: tuple[int, int, str, str] | None = None
        self._candidate_misses: list[tuple[tuple[int, str | None], Miss]] = []
        self._distance_cache: dict[tuple[str, str], tuple[int, int]] = {}

    @property
    def opaque_methods(self) -> set[str]:
        """Callees like ``self._split_heads`` that rules name, so extraction must not inline;
        ``method.get_attention_scores`` names a method called on a submodule of a known class
        (the receiver is the step's first argument)."""
        names: set[str] = set()
        for compiled in self.rules:
            for step in compiled.forward + compiled.where:
                if isinstance(step.callee, Name) and step.callee.dotted.startswith("self."):
                    names.add(step.callee.dotted[len("self.") :])
                elif isinstance(step.callee, Name) and step.callee.dotted.startswith("method."):
                    names.add(step.callee.dotted)
        return names

    # -- driver ------------------------------------------------------------------------------
    def match_file(self, structure: FileStructure) -> list[Site]:
        self.misses = []
        found: dict[tuple[str, str, int, int], Site] = {}
        for flow in structure.all_flows():
            index = self._index(flow)
            called: dict[str, bool] = {}  # per name, shared by the rules naming it
            matched = [
                site
                for compiled in self.rules
                if compiled.first is not None and self._could_match(compiled, index, called)
                for site in self._match_flow(compiled, flow, index)
            ]
            for site in _best_spellings(matched):
                previous = found.get(site.key)
                if previous is None:
                    found[site.key] = site
                elif flow.report_only or _report_only(previous):
                    # An nn.Sequential's own flow only reports what no call expands: a
                    # call that runs the same elements is the site (and its edit).
                    if not flow.report_only:
                        found[site.key] = site
                elif _rival_spellings(previous, site):
                    # Two spellings of one rule at one place (a Llama MLP is also a gated
                    # product; a variant with the mask added where the other took the path
                    # without): one site, the applicable one that accounts for more code.
                    # (Another spelling matched from another method's flow is the same
                    # place reached through another call: an instance, below.)
                    if _preferred(site, previous):
                        site.instances = previous.instances
                        found[site.key] = site
                elif not _same_instance(previous, site):
                    # One site reached through another call (an nn.Sequential called twice).
                    if all(not _same_instance(other, site) for other in previous.instances):
                        previous.instances.append(site)
                    if not site.applicable and previous.applicable:
                        previous.applicable, previous.reason = False, site.reason
                elif previous.applicable and not site.applicable:
                    site.instances = previous.instances
                    found[site.key] = site
        for compiled in self.rules:
            if compiled.first is None:
                for site in self._match_init_only(compiled, structure):
                    found.setdefault(site.key, site)
        if self.call_rules and structure.tree is not None:
            for match in match_calls(self.call_rules, structure.tree):
                site = Site(
                    match.rule,
                    structure.path,
                    match.node.lineno,
                    match.node.col_offset + 1,
                    match.cls,
                    match.function,
                    applicable=match.applicable,
                    reason=match.reason,
                    call=match.node,
                )
                found.setdefault(site.key, site)
        for site in found.values():
            if site.path == structure.path:  # a helper's site in another file keeps its column
                site.column = structure.character_column(site.line, site.column)
                call = site.container_call()
                if call is not None:
                    site.call_column = structure.character_column(call.lineno, call.col_offset + 1)
        sites = sorted(found.values(), key=lambda s: (s.path, s.line, s.column, s.rule.id))
        kept = _without_overlaps(sites)
        if self.explain:
            self.misses = self._explained_misses(structure, sites, kept)
        return kept

    def _index(self, flow: FunctionFlow) -> dict[str, list[FlowStep]]:
        index: dict[str, list[FlowStep]] = {}
        for step in flow.steps:
            kinds = {step.kind} | {k for c in step.alternatives for k in _construction_kinds(c)}
            family = step_family(step.kind)
            if family is not None:
                kinds.add(family)
            for kind in kinds:
                index.setdefault(kind, []).append(step)
        return index

    def _could_match(
        self, compiled: CompiledRule, index: dict[str, list[FlowStep]], called: dict[str, bool]
    ) -> bool:
        """Whether the flow calls each operation the rule's pattern names (a step of some
        kind the name matches, as :meth:`_candidates` and :meth:`_unify` read kinds; ``x / s``
        where a reciprocal ``mul`` may read it). Most rules name an operation most flows never
        call, and the sub-sequence search of their first step's candidates is the matcher's
        main cost. ``called`` keeps each name's answer for the flow's other rules. With
        ``explain`` every rule is searched, for its misses."""
        if self.explain:
            return True
        for name in compiled.required_names:
            found = called.get(name)
            if found is None:
                found = called[name] = next(self._kinds_matching(name, index), None) is not None
            divides = name == "mul" and compiled.rule.reciprocal and "truediv" in index
            if not found and not divides:
                return False
        return True

    def _kinds_matching(self, pattern: str, index: dict[str, list[FlowStep]]) -> Iterator[str]:
        for kind in index:
            key = (pattern, kind)
            hit = self._kind_cache.get(key)
            if hit is None:
                hit = self._kind_cache[key] = _kind_matches(pattern, kind)
            if hit:
                yield kind

    # -- forward matching --------------------------------------------------------------------
    def _match_flow(
        self, compiled: CompiledRule, flow: FunctionFlow, index: dict[str, list[FlowStep]]
    ) -> Iterator[Site]:
        first = compiled.first
        assert first is not None
        for step, swap in self._pairings(
            first, self._candidates(compiled, first, index, flow, None)
        ):
            state = _State({}, [], EMPTY_CONTEXT, {})
            new_state = self._unify(compiled, first, step, state, flow, swap)
            if new_state is None:
                if self.explain and not swap:  # the other order's failure adds nothing
                    self._miss(compiled, step, numbered(first, 0, False), self._reason)
                continue
            self._deepest = None
            fired: Site | None = None
            fired_context: Context = EMPTY_CONTEXT
            alternatives: list[_Alternative] = []
            finals = self._search(compiled, compiled.forward, 1, new_state, flow, index)
            for final in finals:
                where_state = None
                if compiled.where:
                    checking = final.copy()
                    checking.through = _derived_values(final, flow)
                    where_state = next(
                        self._search(compiled, compiled.where, 0, checking, flow, index), None
                    )
                if compiled.where and where_state is None:
                    continue
                site = self._site(compiled, flow, final, where_state)
                if fired is not None:
                    # a further match: kept when it runs on a path no earlier one does
                    if site.applicable and all(
                        not consistent(final.context, other)
                        for other in [fired_context, *(a.context for a in alternatives)]
                    ):
                        alternatives.append(_Alternative(site, final.context))
                    if len(alternatives) == MAX_ALTERNATIVES:
                        break
                    continue
                if self.explain and not site.applicable:
                    self._miss(compiled, step, "", f"matched, but not applicable: {site.reason}")
                fired, fired_context = site, final.context
                if not site.applicable or not _in_other_arms(final.steps):
                    break
            if fired is not None:
                fired.alternatives = [alternative.site for alternative in alternatives]
                yield fired
            if self.explain and not fired and self._deepest is not None:
                self._miss(compiled, step, self._deepest[2], self._deepest[3])

    def _search(
        self,
        compiled: CompiledRule,
        pattern: tuple[Step, ...],
        position: int,
        state: _State,
        flow: FunctionFlow,
        index: dict[str, list[FlowStep]],
    ) -> Iterator[_State]:
        if position == len(pattern):
            yield state
            return
        pattern_step = pattern[position]
        candidates = self._candidates(compiled, pattern_step, index, flow, state)
        if self.explain and not candidates:
            self._note(compiled, pattern, position, 0, _no_candidate(compiled, pattern_step, state))
        for step, swap in self._pairings(pattern_step, candidates):
            if any(step is seen for seen in state.steps):
                if self.explain:
                    self._note(
                        compiled, pattern, position, 1, f"line {step.line} is matched already"
                    )
                continue
            if pattern is compiled.forward and state.steps and step.id <= state.steps[-1].id:
                if self.explain:
                    reason = f"line {step.line} runs before the previous step's call"
                    self._note(compiled, pattern, position, 1, reason)
                continue
            new_state = self._unify(compiled, pattern_step, step, state, flow, swap)
            if new_state is not None:
                yield from self._search(compiled, pattern, position + 1, new_state, flow, index)
            elif self.explain and not swap:  # the other order's failure adds nothing
                self._note(compiled, pattern, position, 2, self._reason)

    @staticmethod
    def _pairings(pattern_step: Step, steps: list[FlowStep]) -> Iterator[tuple[FlowStep, bool]]:
        """Each candidate step, and for ``add``/``mul`` of two operands also with its operands
        swapped: ``cos * q`` binds ``mul($x, $cos)`` either way round, and only a later step
        (``rotate_half($x)``) tells which, so both are searched."""
        two = sum(isinstance(a, Positional) for a in pattern_step.args) == 2
        for step in steps:
            yield step, False
            if two and step.kind in ("add", "mul") and len(step.positional) == 2:
                yield step, True

    def _candidates(
        self,
        compiled: CompiledRule,
        pattern_step: Step,
        index: dict[str, list[FlowStep]],
        flow: FunctionFlow,
        state: _State | None,
    ) -> list[FlowStep]:
        # Follow data flow when the step consumes a value the match already produced.
        if state is not None:
            for arg in pattern_step.args:
                value = arg.value if isinstance(arg, (Positional, Keyword)) else None
                if isinstance(value, Var) and isinstance(
                    state.bindings.get(value.name), BoundOutput
                ):
                    produced = state.bindings[value.name]
                    assert isinstance(produced, BoundOutput)
                    values = state.through.get(produced.value, (produced.value,))
                    steps = [
                        flow.steps[use.step]
                        for derived in values
                        for use in flow.consumers(derived)
                        if use.step is not None
                    ]
                    return list({id(s): s for s in steps}.values())[:MAX_CANDIDATES]
        callee = pattern_step.callee
        if isinstance(callee, Var):
            bound = state.bindings.get(callee.name) if state else None
            if isinstance(bound, BoundModule):
                kinds = [bound.construction.kind]
            else:
                init = compiled.init_by_var.get(callee.name)
                if init is None or not isinstance(_callee_name(init.callee), str):
                    return [s for s in flow.steps if s.module is not None][:MAX_CANDIDATES]
                kinds = list(self._kinds_matching(_callee_name(init.callee), index))
        else:
            name = _callee_name(callee)
            if name is None:
                return []
            kinds = list(self._kinds_matching(name, index))
            if name == "mul" and compiled.rule.reciprocal:  # ``x / s`` may be read as well
                kinds.append("truediv")
        steps: dict[int, FlowStep] = {}
        for kind in kinds:
            for step in index.get(kind, ()):
                steps[step.id] = step
        return [steps[k] for k in sorted(steps)][:MAX_CANDIDATES]

    def _unify(
        self,
        compiled: CompiledRule,
        pattern_step: Step,
        step: FlowStep,
        state: _State,
        flow: FunctionFlow,
        swap: bool = False,
    ) -> _State | None:
        new = state.copy()
        contexts = [new.context, step.context]
        callee = pattern_step.callee
        if isinstance(callee, Var):
            if step.module is None:
                if self.explain:
                    self._reason = (
                        f"wrong callee: line {step.line} calls `{step.kind}`, not a submodule"
                    )
                return None
            bound = new.bindings.get(callee.name)
            if isinstance(bound, BoundModule):
                if bound.path != step.module:
                    if self.explain:
                        self._reason = (
                            f"line {step.line} calls {step.module}, but {callee} is {bound.path}"
                        )
                    return None
            elif bound is not None:
                if self.explain:
                    self._reason = f"{callee} is bound to a value, not a submodule"
                return None
            else:
                init = compiled.init_by_var.get(callee.name)
                chosen = None
                first_miss = ""
                for construction in step.alternatives:
                    if init is None:
                        chosen = construction
                        break
                    trial = new.copy()
                    if self._unify_construction(init, construction, trial):
                        chosen, new = construction, trial
                        break
                    if self.explain and not first_miss:
                        first_miss = describe_construction(init, construction, self._reason)
                if chosen is None:
                    if self.explain:
                        self._reason = first_miss or (
                            f"missing init construction: no construction of {step.module} was found"
                        )
                    return None
                contexts.append(chosen.context)
                new.bindings[callee.name] = BoundModule(step.module, chosen)
                new.constructions[callee.name] = chosen
        else:
            # a plain truediv step (no alternatives): its context is empty, as for its kind
            matched_kind = _reads_division(compiled.rule, pattern_step, step, swap)
            for kind, context in _step_kinds(step):
                if matched_kind:
                    break
                if _callee_matches(callee, kind, new.bindings):
                    matched_kind = True
                    contexts.append(context)
            if not matched_kind:
                if self.explain:
                    self._reason = (
                        f"wrong callee: line {step.line} calls `{callee_text(step)}`, "
                        f"not `{callee}`"
                    )
                return None
        divides = isinstance(callee, Var) is False and _reads_division(
            compiled.rule, pattern_step, step, swap
        )
        edges = self._unify_arguments(pattern_step.args, step, new, swap, divides)
        if edges is None:
            return None
        contexts.extend(edges)
        if not consistent(*contexts):
            if self.explain:
                self._reason = (
                    f"line {step.line} is on another branch than the steps matched before it"
                )
            return None
        for context in contexts:
            new.context = new.context | context
        for target in pattern_step.targets:
            new.bindings[target.name] = BoundOutput(step.output, step)
        new.steps.append(step)
        return new

    def _unify_arguments(
        self, args: tuple, step: FlowStep, state: _State, swap: bool = False, divides: bool = False
    ) -> list[Context] | None:
        """Unify a call's arguments; ``swap``: the operands of a commutative step only in the
        other order (the natural order is then tried on its own, see :meth:`_pairings`);
        ``divides``: ``x / s`` read as ``mul(x, $s)``, the divisor as its reciprocal."""
        edges: list[Context] = []
        has_rest = any(isinstance(a, Rest) for a in args)
        positional_patterns = [a for a in args if isinstance(a, Positional)]
        if not has_rest and len(step.positional) > len(positional_patterns) + sum(
            isinstance(a, Keyword) for a in args
        ):
            if self.explain:
                self._reason = (
                    f"line {step.line} `{step.kind}` has {len(step.positional)} positional "
                    f"arguments, more than the pattern's {len(positional_patterns)}"
                )
            return None
        commutative = step.kind in ("add", "mul") and len(positional_patterns) == 2
        orders = [step.positional]
        if commutative and len(step.positional) == 2:
            orders = [list(reversed(step.positional))] if swap else [step.positional]
        elif swap:
            return None
        if divides:
            orders = [[step.positional[0], Reciprocal.of_divisor(step.positional[1])]]
        elif step.kind in _SWAPPABLE_DIMS and len(step.positional) == 3 and not swap:
            # ``k.transpose(-1, -2)`` is ``k.transpose(-2, -1)``: the two dimensions are a set
            tensor, first, second = step.positional
            orders = [step.positional, [tensor, second, first]]
        for operands in orders:
            order = int(swap)
            trial = state.copy()
            trial_edges: list[Context] = []
            ok = True
            for position, arg in enumerate(positional_patterns):
                operand = operands[position] if position < len(operands) else None
                if operand is None:
                    names = _signature_names(step)
                    if position < len(names):
                        operand = step.arguments.get(names[position])
                if operand is None or not _unify_value(arg.value, operand, trial, trial_edges):
                    if self.explain and not order:
                        which = f"argument {position + 1}"
                        self._reason = _argument_miss(step, which, arg, operand, trial)
                    ok = False
                    break
            if ok:
                for arg in args:
                    if isinstance(arg, Keyword):
                        operand = step.arguments.get(arg.key)
                        if operand is None or not _unify_value(
                            arg.value, operand, trial, trial_edges
                        ):
                            if self.explain and not order:
                                which = f"`{arg.key}=`"
                                self._reason = _argument_miss(step, which, arg, operand, trial)
                            ok = False
                            break
            if ok:
                state.bindings = trial.bindings
                if order:
                    state.swapped += (step.id,)
                    state.notes += (
                        f"operands of `{step.kind}` at line {step.line} matched in the other order",
                    )
                edges.extend(trial_edges)
                return edges
        return None

    def _unify_construction(self, pattern: Step, construction: Construction, state: _State) -> bool:
        name = _callee_name(pattern.callee)
        if name is None or not (
            _kind_matches(name, construction.kind) or name == construction.family
        ):
            if not (
                isinstance(pattern.callee, Index)
                and _callee_matches(pattern.callee, construction.kind, state.bindings)
            ):
                if self.explain:
                    self._reason = f"it is `{construction.kind}`, not `{pattern.callee}`"
                return False
        if isinstance(pattern.callee, Index) and not _callee_matches(
            pattern.callee, construction.kind, state.bindings
        ):
            if self.explain:
                self._reason = f"it is `{construction.kind}`, not `{pattern.callee}`"
            return False
        has_rest = any(isinstance(a, Rest) for a in pattern.args)
        positional = [a for a in pattern.args if isinstance(a, Positional)]
        if not has_rest and len(construction.positional) > len(positional) + sum(
            isinstance(a, Keyword) for a in pattern.args
        ):
            if self.explain:
                self._reason = (
                    f"{len(construction.positional)} positional arguments, more than the "
                    f"pattern's {len(positional)}"
                )
            return False
        edges: list[Context] = []
        for position, arg in enumerate(positional):
            operand = (
                construction.positional[position]
                if position < len(construction.positional)
                else None
            )
            if operand is None or not _unify_value(arg.value, operand, state, edges):
                if self.explain:
                    self._reason = _value_miss(f"argument {position + 1}", arg, operand, state)
                return False
        for arg in pattern.args:
            if isinstance(arg, Keyword):
                operand = construction.arguments.get(arg.key)
                if operand is None or not _unify_value(arg.value, operand, state, edges):
                    if self.explain:
                        self._reason = _value_miss(f"`{arg.key}=`", arg, operand, state)
                    return False
        return True

    # -- the match trace (``explain``) -------------------------------------------------------
    def _note(
        self,
        compiled: CompiledRule,
        pattern: tuple[Step, ...],
        position: int,
        priority: int,
        reason: str,
    ) -> None:
        """Keep the furthest failure of one candidate's search (a ``where`` step is further
        than every forward step); at one depth, the first real mismatch, not a skipped call."""
        is_where = pattern is not compiled.forward
        depth = position + (len(compiled.forward) if is_where else 0)
        if self._deepest is None or (depth, priority) > self._deepest[:2]:
            label = numbered(pattern[position], position, is_where)
            self._deepest = (depth, priority, label, reason)

    def _miss(self, compiled: CompiledRule, candidate: FlowStep, label: str, reason: str) -> None:
        miss = Miss(
            compiled.rule.id,
            candidate.path,
            candidate.line,
            candidate.column,
            owner(candidate),
            label,
            reason,
        )
        self._candidate_misses.append(((id(candidate.node), candidate.module), miss))

    def _explained_misses(
        self, structure: FileStructure, sites: list[Site], kept: list[Site]
    ) -> list[Miss]:
        """The misses of this file: one per place, rule and reason, none where the rule fired
        (the same call seen through another method may have failed) nor at a call that is part of
        a site of the rule (the key projection as the first of three)."""
        fired = {
            (site.rule.id, id(step.node), step.module)
            for site in kept
            if site.applicable
            for step in site.steps
        }
        misses: dict[tuple[object, ...], Miss] = {}
        for node, miss in self._candidate_misses:
            if (miss.rule, *node) not in fired:
                if miss.path == structure.path:  # columns count characters, as sites' do
                    miss = replace(miss, column=structure.character_column(miss.line, miss.column))
                misses.setdefault((*miss.key, miss.step, miss.reason), miss)
        for site in sites:
            if site not in kept and site.steps:
                where = owner(site.steps[0])
                reason = "dropped: its calls overlap an earlier site of the same rule"
                miss = Miss(site.rule.id, site.path, site.line, site.column, where, "", reason)
                misses.setdefault((*miss.key, "", reason), miss)
        tried = {miss.rule for miss in misses.values()} | {site.rule.id for site in sites}
        for compiled in self.rules:
            if compiled.first is not None and compiled.rule.id not in tried:
                label = numbered(compiled.first, 0, False)
                nearest, distance = self._nearest_call(compiled, structure)
                miss = Miss(
                    compiled.rule.id, structure.path, 0, 0, "", label, NO_START, nearest, distance
                )
                misses.setdefault((*miss.key, label, NO_START), miss)
        self._candidate_misses = []
        return sorted(misses.values(), key=lambda m: (m.key, m.step, m.reason))

    def _nearest_call(
        self, compiled: CompiledRule, structure: FileStructure
    ) -> tuple[str, tuple[int, ...]]:
        """The call of the file closest to a rule's first step that matched none: by the edit
        distance of its callee (a submodule's constructor for ``$m(...)`` steps bound by an
        ``init`` step), then by how many positional arguments it differs in, then the earliest.
        ``("", ())`` when the step names no callee or the file has no such call."""
        first = compiled.first
        assert first is not None
        wanted: str | None
        if isinstance(first.callee, Var):
            init = compiled.init_by_var.get(first.callee.name)
            wanted = _callee_name(init.callee) if init is not None else None
        else:
            wanted = _callee_name(first.callee)
        if wanted is None:
            return "", ()
        arity = sum(isinstance(a, Positional) for a in first.args)
        best: tuple[tuple[int, ...], FlowStep] | None = None
        for flow in structure.all_flows():
            for step in flow.steps:
                if step.synthetic or (isinstance(first.callee, Var) and step.module is None):
                    continue
                key = (wanted, step.kind)
                names = self._distance_cache.get(key)
                if names is None:
                    names = self._distance_cache[key] = callee_distance(wanted, step.kind)
                distance = (*names, abs(len(step.positional) - arity), step.line, step.column)
                if best is None or distance < best[0]:
                    best = (distance, step)
        if best is None:
            return "", ()
        distance, step = best
        column = step.column
        if step.path == structure.path:  # columns count characters, as sites' do
            column = structure.character_column(step.line, step.column)
        # the line and column rank only within the file: across files, by name and arity
        return f"{step.path}:{step.line}:{column} {call_text(step)}", distance[:3]

    # -- results -----------------------------------------------------------------------------
    def _site(
        self,
        compiled: CompiledRule,
        flow: FunctionFlow,
        state: _State,
        where_state: _State | None,
    ) -> Site:
        rule = compiled.rule
        first = state.steps[0]
        if rule.site == "init":
            variable = _first_module_var(compiled)
            construction = state.constructions.get(variable) if variable else None
            if construction is not None and construction.path != flow.path:
                construction = None  # built in another file: the site stays in this one
            anchor_line = construction.line if construction else first.line
            anchor_column = construction.column if construction else first.column
            method = construction.method if construction else first.method
        elif first.synthetic and not all(step.synthetic for step in state.steps):
            # A container's elements then the caller's own calls (``self.act(self.conv_bn(x))``
            # with ``conv_bn`` an nn.Sequential): the fusion is the caller's, at its call. The
            # element's line would be shared by every caller of the container.
            anchor_line, anchor_column = first.node.lineno, first.node.col_offset + 1
            method = first.method
        elif (reaching := _reaching_call(rule, flow, state.steps)) is not None:
            # A submodule's forward, then the caller's own calls (a masked-LM head's decoder,
            # then the caller's loss), in a guarded replacement, whose kernel arm replaces the
            # caller's call: the fusion is the caller's, at that call; the decoder's line would
            # be shared by every caller of the head.
            anchor_line, anchor_column = reaching.node.lineno, reaching.node.col_offset + 1
            method = reaching.method
            first = reaching  # the class named with the site, too
        else:
            anchor_line, anchor_column, method = first.line, first.column, first.method
        matched = list(where_state.steps if where_state else state.steps)
        site = Site(
            rule=rule,
            path=flow.path,
            line=anchor_line,
            column=anchor_column,
            cls=first.cls,
            method=method,
            steps=state.steps,
            where_steps=matched[len(state.steps) :],
            constructions=state.constructions,
            bindings=dict((where_state or state).bindings),
            flow=flow,
        )
        site.notes = list(state.notes) + _shape_notes(state.steps)
        site.swapped = state.swapped
        matched_ids = {step.id for step in matched}
        scripted = next((step for step in state.steps if step.scripted), None)
        if scripted is not None and rule.kernel:
            site.applicable = False
            site.reason = (
                f"line {scripted.line} is inside a @torch.jit.script function, which cannot call "
                "the kernel"
            )
            return site
        context = (where_state or state).context
        for name in compiled.intermediates:
            produced = state.bindings.get(name)
            if not isinstance(produced, BoundOutput):
                continue
            for use in flow.consumers(produced.value):
                if use.step is not None and (
                    use.step in matched_ids or flow.steps[use.step].transparent
                ):
                    continue
                if not consistent(context, use.context):
                    continue
                if _tested_in_block(rule, produced.step, use):
                    continue
                where = f"line {flow.steps[use.step].line}" if use.step is not None else use.where
                site.applicable = False
                site.reason = (
                    f"${name} (line {produced.step.line}) is also used elsewhere ({where})"
                )
                return site
        return site

    def _match_init_only(self, compiled: CompiledRule, structure: FileStructure) -> Iterator[Site]:
        assert compiled.rule.init is not None
        pattern = compiled.rule.init.steps[0]
        for info in structure.classes.values():
            for attribute, constructions in info.bindings.items():
                for construction in constructions:
                    state = _State({}, [], EMPTY_CONTEXT, {})
                    if self._unify_construction(pattern, construction, state):
                        yield Site(
                            rule=compiled.rule,
                            path=structure.path,
                            line=construction.line,
                            column=construction.column,
                            cls=info.name,
                            method=construction.method,
                            constructions={attribute: construction},
                            bindings=state.bindings,
                        )


# Steps through which a ``where`` step may consume a matched value: elementwise scaling by
# something that is not a tensor of the computation, contiguity and dtype casts, a
# normalisation module over the last dimension (QK-norm before the heads are split), and a
# concatenation that holds it (``torch.cat([query, encoder_query], dim=1)``).
PASS_THROUGH = frozenset(
    ["mul", "truediv", "Tensor.contiguous", "Tensor.to", "Tensor.type_as", "Tensor.float"]
)
PASS_THROUGH_JOINS = frozenset(["list", "tuple", "torch.cat"])


def _tested_in_block(rule: Rule, produced: FlowStep, use: Use) -> bool:
    """A matched comparison that only decides a branch of a block-scope rule (T5's ``if
    self.weight.dtype in [...]``): the replacement takes over the whole ``if`` with it."""
    return (
        rule.scope == "block"
        and produced.kind == "compare"
        and use.step is None
        and use.where == "condition"
    )


def _passes_through(step: FlowStep) -> bool:
    if step.kind in PASS_THROUGH_JOINS:
        return True
    tensors = [op for op in step.positional if op.flows]
    if len(tensors) != 1:
        return False
    if step.kind in PASS_THROUGH:
        return True
    return step.module is not None and step.kind.rsplit(".", 1)[-1].endswith("Norm")


def _derived_values(state: _State, flow: FunctionFlow) -> dict[int, frozenset[int]]:
    """Each matched output and the values a chain of PASS_THROUGH steps makes of it."""
    derived: dict[int, frozenset[int]] = {}
    for bound in state.bindings.values():
        if not isinstance(bound, BoundOutput):
            continue
        values = [bound.value]
        for value in values:
            for use in flow.consumers(value):
                if use.step is None:
                    continue
                step = flow.steps[use.step]
                if _passes_through(step) and step.output not in values:
                    values.append(step.output)
        derived[bound.value] = frozenset(values)
    return derived


def _no_candidate(compiled: CompiledRule, pattern_step: Step, state: _State) -> str:
    """Why no call of the flow can be tried for a pattern step."""
    for arg in pattern_step.args:
        value = arg.value if isinstance(arg, (Positional, Keyword)) else None
        if isinstance(value, Var) and isinstance(state.bindings.get(value.name), BoundOutput):
            produced = state.bindings[value.name]
            assert isinstance(produced, BoundOutput)
            return f"data flow broken: no call uses {value} (line {produced.step.line})"
    callee = pattern_step.callee
    if isinstance(callee, Var):
        init = compiled.init_by_var.get(callee.name)
        built = f"built by `{init.callee}`" if init is not None else "called"
        return f"no submodule {built} is called here"
    return f"no call of `{callee}` here"


def _value_miss(
    which: str, arg: Positional | Keyword, operand: Operand | None, state: _State
) -> str:
    if operand is None:
        return f"{which} is missing"
    return f"{which}: {describe_value(arg.value, operand, state.bindings)}"


def _argument_miss(
    step: FlowStep, which: str, arg: Positional | Keyword, operand: Operand | None, state: _State
) -> str:
    return f"line {step.line} `{callee_text(step)}`, {_value_miss(which, arg, operand, state)}"


def _reaching_call(rule: Rule, flow: FunctionFlow, steps: list[FlowStep]) -> FlowStep | None:
    """For a match of a guarded replacement that starts in a submodule's inlined ``forward``
    and ends in the function that calls the submodule: the summary step of that call (the one
    call there whose module holds the first step's); ``None`` otherwise. (An unguarded
    replacement is written where its matched calls are, so its site stays there.)"""
    if rule.forward is None or rule.forward.guard is None:
        return None
    first = steps[0]
    outer = min(steps, key=lambda step: len(step.inline_chain))
    if len(first.inline_chain) <= len(outer.inline_chain) or first.module is None:
        return None
    calls = [
        step
        for step in flow.steps
        if step.transparent
        and step.function is outer.function
        and step.inline_chain == outer.inline_chain
        and step.module is not None
        and first.module.startswith(step.module + ".")
        and step.node is not None
    ]
    return calls[0] if len(calls) == 1 else None


def _caller_of(step: FlowStep, reaching: FlowStep | None) -> int | None:
    """The call through which a step inside a submodule's forward ran (see _reaching_call)."""
    if reaching is None or step.function is reaching.function:
        return None
    return id(reaching.node)


def _without_overlaps(sites: list[Site]) -> list[Site]:
    """One site per computation and rule: a match that reuses a call an earlier site of the
    same rule already took (six projections of one tensor make several triples) is dropped,
    unless the rest of it runs only on paths the earlier one's rest does not (the keys and
    values projected in another arm of a branch, the query after it): then it is that site's
    alternative, which a rewrite across the arms fuses in its own arm."""
    claimed: dict[str, dict[tuple[object, ...], Site]] = {}
    kept: list[Site] = []
    for site in sites:
        # the elements of one nn.Sequential call share its node: the module tells them apart;
        # a submodule's calls reached from two callers are two computations (each its own call)
        reaching = None if site.flow is None else _reaching_call(site.rule, site.flow, site.steps)
        nodes = {
            (id(step.node), step.module, _caller_of(step, reaching))
            for step in site.steps
            if step.node is not None
        }
        taken = claimed.setdefault(site.rule.id, {})
        if len(site.steps) > 1 and nodes & taken.keys():
            owners = {id(taken[node]): taken[node] for node in nodes & taken.keys()}
            if len(owners) == 1:
                (earlier,) = owners.values()
                if _in_another_arm(earlier, site, nodes & taken.keys()):
                    earlier.alternatives.append(site)
                    taken.update(dict.fromkeys(nodes, earlier))
            continue
        taken.update(dict.fromkeys(nodes, site))
        kept.append(site)
    return kept


def _in_another_arm(earlier: Site, site: Site, shared: set[tuple[int, str | None]]) -> bool:
    """``site`` shares only ``shared`` with ``earlier`` and its other calls run on no path that
    runs the other calls of ``earlier`` or of an alternative it has already."""
    if not (earlier.applicable and site.applicable):
        return False
    if len(earlier.alternatives) >= MAX_ALTERNATIVES or len(site.steps) != len(earlier.steps):
        return False

    def rest(match: Site) -> Context:
        steps = [s for s in match.steps if (id(s.node), s.module) not in shared]
        return frozenset().union(*(step.context for step in steps))

    own = rest(site)
    if not own:
        return False
    return all(not consistent(own, rest(other)) for other in [earlier, *earlier.alternatives])


@dataclass(frozen=True)
class _Alternative:
    site: Site
    context: Context


def _in_other_arms(steps: list[FlowStep]) -> bool:
    """Some matched step sits in a branch arm the first one does not: other arms of that
    branch may hold the rest of the match too (the paper's Fig. 4)."""
    return any(not step.context <= steps[0].context for step in steps[1:])


def _part_of(part: Site, whole: Site) -> bool:
    """``part`` matched some of the calls ``whole`` matched, and nothing else."""
    calls = {id(step.node) for step in whole.steps}
    own = {id(step.node) for step in part.steps}
    return own < calls


def _best_spellings(sites: list[Site]) -> list[Site]:
    """The sites one flow matched, with only the preferred of the spellings matched at one
    place (:func:`_preferred`). Chosen within each flow before the flows are merged, so that a
    larger spelling a caller's flow matched by reaching into the caller (a cast's result
    multiplied there), and which is unsafe there, does not stand as another call of the callee's
    own, complete match and veto it (NeoMME's RMSNorm, whose weight is applied under
    ``if self.with_scale:``, lost its weighted match that way)."""
    kept: list[Site] = []
    for site in sites:
        rival = next(
            (
                index
                for index, other in enumerate(kept)
                if other.key == site.key and _rival_spellings(other, site)
            ),
            None,
        )
        if rival is None:
            kept.append(site)
        elif _preferred(site, kept[rival]):
            kept[rival] = site
    return kept


def _rival_spellings(first: Site, second: Site) -> bool:
    """Two matches at one place that are spellings of one rule rather than one site reached
    twice: other variants in one flow, or one matching part of what the other matched."""
    return (
        (first.rule is not second.rule and first.flow is second.flow)
        or _part_of(first, second)
        or _part_of(second, first)
    )


def _preferred(site: Site, other: Site) -> bool:
    """Whether ``site`` rather than ``other``, another spelling's match at the same place."""
    return (site.applicable, len(site.steps)) > (other.applicable, len(other.steps))


def _report_only(site: Site) -> bool:
    return site.flow is not None and bool(site.flow.report_only)


def _same_instance(first: Site, second: Site) -> bool:
    """The same matched code (seen from two analysed methods), not another call of it."""
    return [id(step.node) for step in first.steps] == [id(step.node) for step in second.steps]


def _shape_notes(steps: list[FlowStep]) -> list[str]:
    """How a match is laid out in the source, for reports: across classes or methods, or
    through the elements of an ``nn.Sequential``."""
    notes = []
    owners = {(step.cls, step.method) for step in steps}
    if len({cls for cls, _ in owners}) > 1:
        notes.append("spans classes: " + ", ".join(sorted(f"{c}.{m}" for c, m in owners)))
    elif len(owners) > 1:
        notes.append("spans methods: " + ", ".join(sorted(m for _, m in owners)))
    if any(step.synthetic for step in steps):
        notes.append("through nn.Sequential elements")
    if any(step.context for step in steps):
        notes.append("inside a branch or loop")
    return notes


def _first_module_var(compiled: CompiledRule) -> str | None:
    for step in compiled.forward:
        if isinstance(step.callee, Var) and step.callee.name in compiled.init_by_var:
            return step.callee.name
    return next(iter(compiled.init_by_var), None)


def _signature_names(step: FlowStep) -> list[str]:
    return parameter_names(step.kind)[0]


def _reads_division(rule: Rule, pattern_step: Step, step: FlowStep, swap: bool) -> bool:
    """Whether ``step`` is ``x / s`` that ``pattern_step``, ``mul(x, $s)`` with ``$s`` one of
    the rule's ``reciprocal`` variables, reads as ``x * (1 / s)``: the two are one value up to
    rounding (which verify measures), and the kernel is handed ``1 / s``."""
    if swap or step.kind != "truediv" or len(step.positional) != 2 or step.arguments:
        return False
    if _callee_name(pattern_step.callee) != "mul" or step.positional[1].node is None:
        return False
    positional = [a for a in pattern_step.args if isinstance(a, Positional)]
    return (
        len(positional) == 2
        and len(pattern_step.args) == 2
        and isinstance(positional[1].value, Var)
        and positional[1].value.name in rule.reciprocal
    )


def _step_kinds(step: FlowStep) -> Iterator[tuple[str, Context]]:
    if step.alternatives:
        for construction in step.alternatives:
            for kind in _construction_kinds(construction):
                yield kind, construction.context
    else:
        yield step.kind, EMPTY_CONTEXT
        family = step_family(step.kind)
        if family is not None:
            yield family, EMPTY_CONTEXT


def _construction_kinds(construction: Construction) -> tuple[str, ...]:
    """The kind of a construction and the canonical family a rule may name instead."""
    if construction.family:
        return (construction.kind, construction.family)
    return (construction.kind,)


def _callee_name(callee: Expr) -> str | None:
    if isinstance(callee, Name):
        return callee.dotted
    if isinstance(callee, Index) and isinstance(callee.base, Name):
        return callee.base.dotted
    return None


def _kind_matches(pattern: str, kind: str) -> bool:
    base = kind.split("[", 1)[0] if "[" in kind and "[" not in pattern else kind
    return dotted_suffix_match(pattern, base)


def _callee_matches(callee: Expr, kind: str, bindings: dict[str, object]) -> bool:
    if isinstance(callee, Name):
        return "[" not in kind and dotted_suffix_match(callee.dotted, kind)
    if isinstance(callee, Index) and isinstance(callee.base, Name):
        base, bracket, rest = kind.partition("[")
        if not bracket or not dotted_suffix_match(callee.base.dotted, base):
            return False
        item = rest[:-1]
        if isinstance(callee.item, Var):
            bound = bindings.get(callee.item.name)
            if bound is None:
                bindings[callee.item.name] = item
                return True
            return bound == item
        if isinstance(callee.item, Wildcard):
            return True
        return str(callee.item) == item
    return False


def _unify_value(pattern: Expr, operand: Operand, state: _State, edges: list[Context]) -> bool:
    if isinstance(pattern, Wildcard):
        return True
    if isinstance(pattern, Literal):
        if isinstance(pattern.value, bool) and not operand.is_constant and operand.node is not None:
            # A flag only known at run time (``bias=config.mlp_bias``) may take the literal's
            # value; the kernel handles both (the rule says which flag it needs).
            return True
        return (
            operand.is_constant
            and operand.constant == pattern.value
            and type(operand.constant) is type(pattern.value)
        )
    if isinstance(pattern, Name):
        return operand.text == pattern.dotted
    if isinstance(pattern, (Index, Call)):
        return operand.text == str(pattern)
    if isinstance(pattern, Attribute):
        # ``$module.training``: ``$module`` is the text of the object the attribute is read from
        node = operand.node
        if not (isinstance(node, ast.Attribute) and node.attr == pattern.name):
            return False
        owner = ast.unparse(node.value)
        bound = state.bindings.setdefault(pattern.base.name, owner)
        if isinstance(bound, Operand):  # ``$query.dtype`` of a ``$query`` bound as an argument
            return bound.text == owner
        return isinstance(bound, str) and bound == owner
    assert isinstance(pattern, Var)
    bound = state.bindings.get(pattern.name)
    if bound is None:
        state.bindings[pattern.name] = operand
        return True
    if isinstance(bound, BoundOutput):
        accepted = state.through.get(bound.value, (bound.value,))
        for flow in operand.flows:
            if flow.value in accepted:
                edges.append(flow.context)
                return True
        return False
    if isinstance(bound, BoundModule):
        return operand.module is not None and operand.module.path == bound.path
    if isinstance(bound, Operand):
        if bound.flows or operand.flows:
            # the same value on one path: ``current_states = kv if cross else hidden_states``
            # is ``hidden_states`` where there is no cross-attention
            for flow in operand.flows:
                for other in bound.flows:
                    if flow.value == other.value and consistent(flow.context, other.context):
                        edges.append(flow.context | other.context)
                        return True
            return False
        if bound.is_constant or operand.is_constant:
            return bound.constant == operand.constant
        return bound.text == operand.text
    return isinstance(bound, str) and bound == operand.text


def _values(flows: tuple[Flow, ...]) -> frozenset[int]:
    return frozenset(flow.value for flow in flows)
