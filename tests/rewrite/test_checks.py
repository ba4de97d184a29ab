"""The planner's safety checks, called directly on tiny inputs. Each test shows a check both
passing and refusing (a check that cannot refuse guards nothing), and that the refusal names
the check it came from; the last tests hold the planner to giving every reason through one."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import adopter.rewrite.apply as apply_module
from adopter.dsl import load_rule_file
from adopter.dsl.syntax import DETECT_ONLY, Index, Literal, Name, Positional, Var, Wildcard
from adopter.dsl.syntax import Step as PatternStep
from adopter.extract.model import EMPTY_CONTEXT, Operand
from adopter.extract.model import Step as FlowStep
from adopter.match import Matcher
from adopter.match.matcher import BoundOutput
from adopter.rewrite import checks, rewrite_text
from adopter.rewrite.checks import CHECKS, Refusal
from adopter.rewrite.source import Blocks, SourceText
from adopter.rules import rule_files
from tests.rules.fixture_cases import fixture_path, read_fixture

REWRITE = Path(checks.__file__).parent


def _refused(refusal: Refusal | None, check, text: str) -> None:
    """``refusal`` came from ``check`` and says ``text``."""
    assert refusal is not None, f"{check.__name__} did not refuse"
    assert refusal.check == check.__name__
    assert text in refusal.reason and str(refusal) == refusal.reason


def _function(code: str) -> tuple[SourceText, ast.FunctionDef, Blocks]:
    function = ast.parse(code).body[0]
    assert isinstance(function, ast.FunctionDef)
    return SourceText(code), function, Blocks(function)


def _flow_step(node: ast.AST, statement: ast.stmt | None = None, line: int = 1) -> FlowStep:
    return FlowStep(
        id=0,
        kind="f",
        positional=[],
        arguments={},
        output=0,
        line=line,
        column=1,
        context=EMPTY_CONTEXT,
        cls=None,
        method="forward",
        path="m.py",
        node=node,
        statement=statement,
    )


def _step(callee: str = "adopter.kernels.k") -> PatternStep:
    return PatternStep(callee=Name(callee), args=(Positional(Var("x")),), targets=(Var("y"),))


def test_single_step():
    assert checks.check_single_step((_step(),), "forward") is None
    _refused(
        checks.check_single_step((_step(), _step()), "forward"),
        checks.check_single_step,
        "only single-step forward replacements are supported",
    )


def test_rewrites():
    assert checks.check_rewrites(None, (_step(),)) is None
    assert checks.check_rewrites((_step(),), None) is None
    _refused(checks.check_rewrites(None, DETECT_ONLY), checks.check_rewrites, "only detects")
    _refused(checks.check_rewrites(None, ()), checks.check_rewrites, "has no replacement")


def test_kernel_package():
    assert checks.check_kernel_package("adopter.kernels.fused_rms_norm") is None
    _refused(
        checks.check_kernel_package("torch.nn.functional.gelu"),
        checks.check_kernel_package,
        "replacement calls torch.nn.functional.gelu, which is not in adopter.kernels",
    )


def test_renderable_value():
    for value in (Var("x"), Name("torch.float32"), Literal(1)):
        assert checks.check_renderable_value(value) is None
    wildcard = checks.check_renderable_value(Wildcard())
    _refused(wildcard, checks.check_renderable_value, "cannot pass `_`")
    index = checks.check_renderable_value(Index(Var("x"), Literal(0)))
    _refused(index, checks.check_renderable_value, "cannot render replacement argument")


def test_bound():
    assert checks.check_bound("eps", "1e-6") is None
    assert checks.check_bound("x", Operand(node=ast.Name("x"))) is None
    produced = BoundOutput(value=3, step=None)  # type: ignore[arg-type]
    _refused(checks.check_bound("h", produced), checks.check_bound, "$h is an intermediate value")
    _refused(checks.check_bound("h", None), checks.check_bound, "$h is not bound by the match")


def test_dropout_handed_over():
    def refusal(text: str) -> Refusal | None:
        call = ast.parse(text).body[0].value  # type: ignore[attr-defined]
        given = dict(zip(["input", "p", "training", "inplace"], call.args))
        given.update({k.arg: k.value for k in call.keywords if k.arg is not None})
        return checks.check_dropout_handed_over(call, given)

    assert refusal("F.dropout(x, 0.1, training=self.training)") is None
    assert refusal("F.dropout(x, p=0.1, inplace=False)") is None
    check = checks.check_dropout_handed_over
    _refused(refusal("F.dropout(x, p=0.1, inplace=True)"), check, "an in-place dropout")
    _refused(refusal("F.dropout(x, **options)"), check, "cannot be handed over")


def test_expression():
    expression = ast.parse("f(x)\n").body[0]
    assert isinstance(expression, ast.Expr)
    assert checks.check_expression(_flow_step(expression.value)) is None
    _refused(
        checks.check_expression(_flow_step(expression, line=7)),
        checks.check_expression,
        "line 7: matched computation is not an expression",
    )


def test_no_elif():
    code = "def f(a, b):\n    if a:\n        x = 1\n    elif b:\n        x = 2\n"
    source, function, _ = _function(code)
    branch = function.body[0]
    assert isinstance(branch, ast.If)
    _refused(checks.check_no_elif(source, branch), checks.check_no_elif, "continues with `elif`")
    code = "def f(a, b):\n    if a:\n        x = 1\n    else:\n        if b:\n            x = 2\n"
    source, function, _ = _function(code)
    assert checks.check_no_elif(source, function.body[0]) is None  # type: ignore[arg-type]


def test_condition_stays():
    _, function, _ = _function("def f(a):\n    y = g(a)\n    if a:\n        pass\n")
    moved, branch = function.body
    assert checks.check_condition_stays(branch, moved) is None  # type: ignore[arg-type]
    _, function, _ = _function("def f(a):\n    a = g(a)\n    if a:\n        pass\n")
    moved, branch = function.body
    _refused(
        checks.check_condition_stays(branch, moved),  # type: ignore[arg-type]
        checks.check_condition_stays,
        "line 3: the condition reads what would move",
    )
    _, function, _ = _function("def f(a):\n    y = g(a)\n    if h(a):\n        pass\n")
    moved, branch = function.body
    _refused(
        checks.check_condition_stays(branch, moved),  # type: ignore[arg-type]
        checks.check_condition_stays,
        "line 3: the condition calls something",
    )


def test_between():
    code = "def f(x, r):\n    h = drop(x)\n    {}\n    y = norm(h + r)\n"
    for between, reason in [
        ("r = r * 2", "line 3 reassigns an input of the fused call"),
        ("print(h)", "line 3 reads a name the fused statement sets"),
    ]:
        _, function, blocks = _function(code.format(between))
        first, _, last = function.body
        refusal = checks.check_between(first, last, [first], {"x", "r"}, blocks)
        _refused(refusal, checks.check_between, reason)
    _, function, blocks = _function(code.format("z = 1"))
    first, _, last = function.body
    assert checks.check_between(first, last, [first], {"x", "r"}, blocks) is None


def test_feeds_later():
    _, function, blocks = _function("def f(x):\n    h = a(x)\n    y = b(h)\n")
    first, last = function.body
    assert checks.check_feeds_later(blocks, first, last) is None
    _refused(
        checks.check_feeds_later(blocks, last, first),
        checks.check_feeds_later,
        "comes after the statement it feeds",
    )


def test_one_block():
    _, function, blocks = _function("def f(x, c):\n    q = a(x)\n    if c:\n        k = b(x)\n")
    first, branch = function.body
    inner = branch.body[0]  # type: ignore[attr-defined]
    assert checks.check_one_block([first], blocks, "assignments") is None
    _refused(
        checks.check_one_block([first, inner], blocks, "assignments"),
        checks.check_one_block,
        "the fused assignments (lines 2, 4) sit in different blocks",
    )


def test_sequential_indexes():
    assert checks.check_consecutive([2, 3, 4]) is None
    _refused(checks.check_consecutive([1, 3]), checks.check_consecutive, "not consecutive")
    assert checks.check_last_elements([2, 3], 4) is None
    _refused(checks.check_last_elements([1, 2], 4), checks.check_last_elements, "not its last")


def test_fresh_name():
    assert checks.check_fresh_name("fused_q", {"q", "x"}, "function") is None
    _refused(
        checks.check_fresh_name("q", {"q", "x"}, "helper"),
        checks.check_fresh_name,
        "the helper already uses the name `q`",
    )


def test_helper_returns():
    _, helper, _ = _function("def forward(self, x):\n    h = self.drop(x)\n    return h\n")
    final = helper.body[0].value  # type: ignore[attr-defined]
    assert checks.check_helper_returns(helper, final) is None
    code = "def forward(self, x):\n    if x is None:\n        return x\n    return self.drop(x)\n"
    _, helper, _ = _function(code)
    final = helper.body[-1].value  # type: ignore[attr-defined]
    _refused(
        checks.check_helper_returns(helper, final),
        checks.check_helper_returns,
        "forward() returns in several places",
    )


def test_sinkable():
    _, function, _ = _function("def f(x):\n    y = norm(x)\n    self.y = norm(x)\n")
    plain, attribute = function.body
    assert checks.check_sinkable(plain, plain.value) is None  # type: ignore[attr-defined]
    _refused(
        checks.check_sinkable(attribute, attribute.value),  # type: ignore[attr-defined]
        checks.check_sinkable,
        "line 3: the statement after the branch does more",
    )


def test_whole_lines():
    source, function, _ = _function("def f(x):\n    h = a(x)\n    y = b(h); z = 1\n")
    block = function.body
    assert checks.check_whole_lines(source, block, 0, 0) is None
    _refused(
        checks.check_whole_lines(source, block, 0, 1),
        checks.check_whole_lines,
        "line 2: the matched statements share a line with other code",
    )


def test_only_matched_work():
    source, function, _ = _function("def f(x):\n    h = a(x)\n    log(h)\n    return b(h)\n")
    first, logged, returned = function.body
    matched = [first.value, returned.value]  # type: ignore[attr-defined]
    check = checks.check_only_matched_work
    assert check(source, [first], matched, None) is None
    assert check(source, [returned], matched, returned) is None  # type: ignore[arg-type]
    _refused(check(source, [first, logged], matched, None), check, "`log(h)` runs among")
    _refused(check(source, [returned], matched, None), check, "also hold `return`")


def test_every_check_is_registered_and_named_check():
    defined = {
        name
        for name, value in vars(checks).items()
        if inspect.isfunction(value) and name.startswith("check_") and name != "check"
    }
    assert defined == set(CHECKS)
    assert len(CHECKS) > 40


@pytest.mark.parametrize("module", ["plan.py", "across.py", "arms.py", "render.py", "guarded.py"])
def test_the_planner_refuses_only_through_checks(module):
    """No refusal is made outside checks.py: each reason has exactly one check to look at."""
    tree = ast.parse((REWRITE / module).read_text(encoding="utf-8"))
    made = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        if node.func.id == "Refusal"
    ]
    assert not made, f"{module} makes refusals at lines {made}"


def test_every_skip_of_the_rule_fixtures_names_its_check(monkeypatch):
    """Each refusal the planner gives on the rule fixtures' cases carries the name of a
    registered check, and the reason reports print is that refusal's text."""
    refusals: list[Refusal] = []
    plan = apply_module.Planner.plan

    def recording(self, site):
        try:
            return plan(self, site)
        except Refusal as refusal:
            refusals.append(refusal)
            raise

    monkeypatch.setattr(apply_module.Planner, "plan", recording)
    reasons: set[str] = set()
    for rule_file in rule_files("all"):
        matcher = Matcher(load_rule_file(rule_file))
        for case in read_fixture(fixture_path(rule_file)):
            rewrite = rewrite_text(case.source, "fixture.py", matcher)
            reasons |= {r.reason for r in rewrite.results if r.skip == "unsafe"}
    assert refusals and reasons
    assert {refusal.check for refusal in refusals} <= set(CHECKS)
    assert reasons <= {refusal.reason for refusal in refusals}


def test_arm_chain():
    code = (
        "def f(x, c, d):\n"
        "    q = a(x)\n"
        "    if c:\n"
        "        k = b(x)\n"
        "        v = e(x)\n"
        "    elif d:\n"
        "        k = b(x)\n"
        "        v = e(x)\n"
        "    else:\n"
        "        k, v = c\n"
    )
    source, function, blocks = _function(code)
    first, branch = function.body
    inner = branch.orelse[0]  # type: ignore[attr-defined]
    arm, elif_arm = branch.body, inner.body  # type: ignore[attr-defined]
    assert checks.check_arm_chain(source, blocks, [[first, *arm], [first, *elif_arm]]) is None
    _refused(
        checks.check_arm_chain(source, blocks, [[first, arm[0], elif_arm[1]]]),
        checks.check_arm_chain,
        "the fused assignments (lines 2, 4, 8) sit in different blocks, not all directly in one",
    )
    _refused(
        checks.check_arm_chain(source, blocks, [[first, *arm], [first, *arm]]),
        checks.check_arm_chain,
        "two matches share the arm of line 4",
    )
    _refused(
        checks.check_arm_chain(source, blocks, [[first, *arm], [arm[0], *elif_arm]]),
        checks.check_arm_chain,
        "the matches in other arms share other statements",
    )


def test_arm_chain_after_the_chain():
    """The shared statement may follow the chain instead of preceding it, but not straddle it."""
    code = (
        "def f(x, c):\n"
        "    if c:\n"
        "        k = b(x)\n"
        "        v = e(x)\n"
        "    else:\n"
        "        k = b(x)\n"
        "        v = e(x)\n"
        "    q = a(x)\n"
        "    w = a(x)\n"
    )
    source, function, blocks = _function(code)
    branch, query, other = function.body
    arm, else_arm = branch.body, branch.orelse  # type: ignore[attr-defined]
    assert checks.check_arm_chain(source, blocks, [[*arm, query], [*else_arm, query]]) is None
    before = ast.parse("q = a(x)").body[0]
    function.body.insert(0, before)
    blocks = Blocks(function)
    _refused(
        checks.check_arm_chain(source, blocks, [[before, *arm, query]]),
        checks.check_arm_chain,
        "on both sides of the branch at line 2",
    )
    nested = ast.parse("for i in y:\n    k = b(x)\n").body[0]
    loop = ast.parse("for i in y:\n    v = e(x)\n").body[0]
    function.body = [nested, loop, query]
    blocks = Blocks(function)
    _refused(
        checks.check_arm_chain(source, blocks, [[nested.body[0], loop.body[0], query]]),  # type: ignore[attr-defined]
        checks.check_arm_chain,
        "not in the arms of one `if` beside the others",
    )


def test_arm_keeps_inputs():
    _, function, _ = _function("def f(x, c):\n    k = b(x)\n    y = k * 2\n    x.add_(1)\n")
    first, second, third = function.body
    assert checks.check_arm_keeps_inputs([first, second], {"x"}) is None
    _refused(
        checks.check_arm_keeps_inputs([first, second, third], {"x"}),
        checks.check_arm_keeps_inputs,
        "line 4 changes an input of the fused call",
    )


def test_chain_conditions():
    code = "def f(x, c):\n    q = a(x)\n    if {}:\n        pass\n    elif {}:\n        pass\n"
    _, function, _ = _function(code.format("c", "c is None"))
    moved, branch = function.body
    tests = [branch, branch.orelse[0]]  # type: ignore[attr-defined]
    assert checks.check_chain_conditions(tests, [moved]) is None  # type: ignore[arg-type]
    for first, second, reason in [
        ("c", "q is None", "line 5: the condition reads what would move"),
        ("(x := c)", "c", "line 3: the condition sets what would move"),
        ("c", "g(c)", "line 5: the condition calls something"),
    ]:
        _, function, _ = _function(code.format(first, second))
        moved, branch = function.body
        tests = [branch, branch.orelse[0]]  # type: ignore[attr-defined]
        _refused(
            checks.check_chain_conditions(tests, [moved]),  # type: ignore[arg-type]
            checks.check_chain_conditions,
            reason,
        )


def test_inputs_kept_sees_changes_in_place():
    code = "def f(x):\n    q = a(x)\n    {}\n    k = b(x)\n"
    for between in ["x.mul_(2)", "x[0] = 1", "x.data = y", "x = x + 1"]:
        _, function, blocks = _function(code.format(between))
        first, _, last = function.body
        _refused(
            checks.check_inputs_kept(blocks, [first, last], {"x"}),
            checks.check_inputs_kept,
            "line 3 changes an input of the fused call",
        )
    for between in ["y = x.sum()", "x.__len__()", "z = x[0]"]:
        _, function, blocks = _function(code.format(between))
        first, _, last = function.body
        assert checks.check_inputs_kept(blocks, [first, last], {"x"}) is None


def test_between_a_moved_statement_and_its_branch_only_dependences_count():
    """A statement moved past others into the arms of an ``if`` may pass one that reads what it
    reads; not one that writes (or changes in place) what it reads, or reads what it sets."""
    code = "def f(x, c):\n    q = a(x)\n    {}\n    if c:\n        k = b(x)\n"
    for between in ["n = x.size(0)", "m = self.tokens if c else 0"]:
        _, function, blocks = _function(code.format(between))
        first, _, branch = function.body
        assert checks.check_between(first, branch, [first], {"x"}, blocks) is None
    for between in ["print(q)", "x.mul_(2)", "x = x + 1", "q = 1"]:
        _, function, blocks = _function(code.format(between))
        first, _, branch = function.body
        _refused(
            checks.check_between(first, branch, [first], set(), blocks),
            checks.check_between,
            "line 3 depends on the statement to be moved",
        )


def test_carried():
    _, function, _ = _function(
        "def f(x, q):\n    q = q.view(2)\n    x.mul_(q)\n    if q:\n        q = 1\n"
    )
    simple, changes, compound = function.body
    assert checks.check_carried(simple, {"x"}) is None
    _refused(checks.check_carried(changes, {"x"}), checks.check_carried, "changes an input")
    _refused(checks.check_carried(compound, {"x"}), checks.check_carried, "not a simple line")


def test_runs_with_its_statement():
    _, function, _ = _function("def f(h):\n    v = p(h) if p else h\n    w = c and p(h)\n")
    conditional, short = function.body
    value = conditional.value  # type: ignore[attr-defined]
    assert checks.check_runs_with_its_statement(_flow_step(value.body, conditional, 2)) is None
    assert checks.path_conditions(_flow_step(value.body, conditional, 2)) == [(value.test, True)]
    right = short.value.values[1]  # type: ignore[attr-defined]
    _refused(
        checks.check_runs_with_its_statement(_flow_step(right, short, 3)),
        checks.check_runs_with_its_statement,
        "line 3: the projection runs only on some paths of its line",
    )


def test_one_condition_and_one_guard():
    _, function, _ = _function(
        "def f(self, h, c):\n    v = p(h) if self.p is not None else h\n"
        "    w = p(h) if c else h\n    c = 1\n"
    )
    first, second, _ = function.body
    on_self = [(first.value.test, True)]  # type: ignore[attr-defined]
    on_local = [(second.value.test, True)]  # type: ignore[attr-defined]
    assert checks.check_one_condition(function, [[], on_self]) is None
    _refused(
        checks.check_one_condition(function, [on_self, on_local]),
        checks.check_one_condition,
        "the projections run in the arms of different conditional expressions",
    )
    _refused(
        checks.check_one_condition(function, [[], on_local]),
        checks.check_one_condition,
        "line 3: the conditional projection's test cannot be evaluated ahead",
    )
    assert checks.check_one_guard(None) is None
    _refused(checks.check_one_guard("a is b"), checks.check_one_guard, "a conditional projection")


def test_copied_submodule_checks():
    _, helper, _ = _function(
        "def forward(self, features, scale=2):\n"
        "    x = self.dense(features) * scale\n"
        "    if x:\n"
        "        x = 1\n"
        "    y = self\n"
        "    return self.decoder(x)\n"
    )
    plain, compound, bare, returned = helper.body
    assert checks.check_copyable_prefix(helper, [plain]) is None
    for statement in (compound, bare):
        _refused(
            checks.check_copyable_prefix(helper, [statement]),
            checks.check_copyable_prefix,
            "does work before the match that is not copied",
        )
    final = returned.value  # type: ignore[attr-defined]
    assert checks.check_helper_ends_with_match(helper, [returned], [returned], final) is None
    _refused(
        checks.check_helper_ends_with_match(helper, [compound, returned], [returned], final),
        checks.check_helper_ends_with_match,
        "does more after the matched computation starts",
    )
    call = ast.parse("self.lm_head(h, scale=f(h))").body[0].value  # type: ignore[attr-defined]
    given = {"features": call.args[0], "scale": call.keywords[0].value}
    defaults = {"scale": ast.Constant(2)}
    chosen = ast.parse("self.lm_head(h if c else g)").body[0].value  # type: ignore[attr-defined]
    assert (
        checks.check_helper_arguments(
            helper, chosen, ["features"], {"features": chosen.args[0]}, defaults
        )
        is None
    )
    _refused(
        checks.check_helper_arguments(helper, call, ["features"], given, defaults),
        checks.check_helper_arguments,
        "the argument for `scale` of forward() calls something",
    )
    _refused(
        checks.check_helper_arguments(helper, chosen, ["features", "other"], {}, defaults),
        checks.check_helper_arguments,
        "forward() reads `features`, which the call does not give",
    )
    assert checks.check_module_helper_call("self.lm_head", [call]) is None
    _refused(
        checks.check_module_helper_call("self.lm_head", [call, call]),
        checks.check_module_helper_call,
        "self.lm_head() is called more than once",
    )
    assert checks.check_globals_kept(helper, {"gelu"}, {"x"}) is None
    _refused(
        checks.check_globals_kept(helper, {"gelu"}, {"gelu"}),
        checks.check_globals_kept,
        "the caller binds `gelu`, which forward() reads as a global",
    )
    x = plain.value  # type: ignore[attr-defined]
    assert checks.check_operand_copyable("hidden", x, {"y"}) is None
    _refused(
        checks.check_operand_copyable("hidden", x, {"features"}),
        checks.check_operand_copyable,
        "$hidden reads `features`, which the submodule sets among the matched",
    )


def test_distinct_calls():
    _, function, _ = _function("def f(h):\n    q = a(h)\n    k = b(h)\n")
    first, second = function.body
    one, other = _flow_step(first.value, first, 2), _flow_step(second.value, second, 3)  # type: ignore[attr-defined]
    assert checks.check_distinct_calls([one, other]) is None
    _refused(
        checks.check_distinct_calls([one, one]),
        checks.check_distinct_calls,
        "line 2: the projections are one call of a module reached once for each",
    )


def test_condition_first():
    _, function, _ = _function(
        "def f(self, x):\n    x = conv(x)\n    if self.norm is not None:\n        x = 1\n"
        "    if self.ok():\n        x = 2\n    if x:\n        x = 3\n"
    )
    first, plain, calls, reads = function.body
    assert checks.check_condition_first(plain, [first]) is None  # type: ignore[arg-type]
    _refused(
        checks.check_condition_first(calls, [first]),  # type: ignore[arg-type]
        checks.check_condition_first,
        "line 5: the condition calls something",
    )
    _refused(
        checks.check_condition_first(reads, [first]),  # type: ignore[arg-type]
        checks.check_condition_first,
        "line 7: the condition reads `x`, set by the matched statements",
    )
    assert checks.check_inputs_not_moved([]) is None
    _refused(
        checks.check_inputs_not_moved([first]),
        checks.check_inputs_not_moved,
        "line 2: an input with a call would move",
    )


def test_some_arm_fuses():
    _, function, _ = _function("def f(x, c):\n    if c:\n        x = 1\n")
    (branch,) = function.body
    assert checks.check_some_arm_fuses(branch, [1]) is None  # type: ignore[arg-type]
    _refused(
        checks.check_some_arm_fuses(branch, []),  # type: ignore[arg-type]
        checks.check_some_arm_fuses,
        "line 2: every arm of the branch between the projections changes their input",
    )


def test_check_matched_on_every_path():
    code = (
        "def f(self, x, mask, flag):\n"
        "    h = norm(x)\n"
        "    if mask is not None:\n"
        "        h = h + mask\n"
        "    if flag:\n"
        "        h = h * self.weight\n"
        "    return h\n"
    )
    _, function, _ = _function(code)
    first, masked, flagged, returned = function.body
    norm = first.value  # type: ignore[attr-defined]
    add = masked.body[0].value  # type: ignore[attr-defined]
    mul = flagged.body[0].value  # type: ignore[attr-defined]
    check = checks.check_matched_on_every_path
    assert check([first, returned], [norm], []) is None
    # the arm that skips the add is the one where the mask it reads is None
    assert check([first, masked, returned], [norm, add], []) is None
    _refused(check([first, flagged], [norm, mul], []), check, "runs only on some paths")
    # a condition that is part of the match decides the arm itself
    assert check([first, flagged], [norm, mul], [flagged.test]) is None  # type: ignore[attr-defined]
    conditional = ast.parse("h = (h * w) if flag else h").body[0]
    product = conditional.value.body  # type: ignore[attr-defined]
    _refused(check([conditional], [product], []), check, "(`ifexp`)")


def test_constant_not_returned_over():
    check = checks.check_constant_not_returned_over
    assert check({"logits"}, ast.parse("loss = f(logits)").body[0]) is None
    returned = ast.parse("return f(logits)").body[0]
    _refused(check({"logits"}, returned), check, "return reads `logits`")


def test_weights_not_kept_unasked():
    """modern.4's kernel returns the attention probabilities only when asked: a file that keeps
    them unasked (BridgeTower) is refused; another kernel, or a file that asks, passes."""
    check = checks.check_weights_not_kept_unasked
    _refused(check("adopter.kernels.attention_function", [12]), check, "line 12")
    assert check("adopter.kernels.attention_function", []) is None
    assert check("adopter.kernels.rms_norm", [12]) is None
    assert check("", [12]) is None


def test_unasked_collections_are_the_ones_outside_a_test_asking_for_them():
    from adopter.rewrite.collected import unasked_collections

    code = """
def forward(self, hidden, output_attentions=False):
    all_self_attentions = []
    all_cross_attentions = () if output_attentions else None
    for layer in self.layers:
        hidden, weights, cross = layer(hidden)
        all_self_attentions.append(weights)
        if output_attentions:
            all_cross_attentions += (cross,)
        if all_cross_attentions is not None:
            all_cross_attentions = all_cross_attentions + (cross,)
        try:
            all_cross_attentions += (cross,)
        except TypeError:
            all_self_attentions.extend([weights])
        all_self_attentions += self.inner(hidden).attentions or ()
    return hidden, all_self_attentions
"""
    assert unasked_collections(ast.parse(code)) == [7, 13, 15]  # not 16: the inner model's
