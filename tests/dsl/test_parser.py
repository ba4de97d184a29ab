import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adopter.dsl import (
    DETECT_ONLY,
    DslError,
    Index,
    Keyword,
    Literal,
    Name,
    Positional,
    Rest,
    Var,
    format_sequence,
    load_rule_file,
    parse_rules,
    parse_sequence,
)

RULE = """
# A rule with everything.
rule demo.1 {
    name: "demo"
    description: "what it finds"
    kernel: "pkg.kernel"
    init {
        @torch.nn.Linear(..., bias=True) -> $linear;
        @ACT2FN[$name] -> $act
    }
    forward {
        $linear($x) -> $h;
        $act($h) -> $y
    } => {
        pkg.kernel($x, $linear, $act) -> $y
    }
}
"""


def test_parses_sequence_with_bindings():
    steps = parse_sequence("Linear($x) -> $h; ACT2FN[config.hidden_act]($h) -> $h")
    assert [str(s) for s in steps] == [
        "Linear($x) -> $h",
        "ACT2FN[config.hidden_act]($h) -> $h",
    ]
    assert steps[1].callee == Index(Name("ACT2FN"), Name("config.hidden_act"))
    assert steps[0].args == (Positional(Var("x")),)


def test_parses_keywords_literals_rest():
    (step,) = parse_sequence("torch.nn.functional.softmax($x, dim=-1, dtype=None, ...)")
    assert step.args == (
        Positional(Var("x")),
        Keyword("dim", Literal(-1)),
        Keyword("dtype", Literal(None)),
        Rest(),
    )


def test_parses_full_rule():
    (rule,) = parse_rules(RULE)
    assert rule.id == "demo.1" and rule.kernel == "pkg.kernel"
    assert rule.init is not None and rule.init.steps[1].lookup
    assert str(rule.init.steps[1]) == "@ACT2FN[$name] -> $act"
    assert rule.forward is not None
    assert isinstance(rule.forward.replacement, tuple)
    assert str(rule.forward.replacement[0]) == "pkg.kernel($x, $linear, $act) -> $y"
    assert not rule.detect_only


def test_detect_only_wildcard():
    (rule,) = parse_rules("rule a.b { forward { f($x) -> $y } => _ }")
    assert rule.forward.replacement == DETECT_ONLY and rule.detect_only


def test_tuple_targets():
    (step,) = parse_sequence("k($x) -> ($q, $k, $v)")
    assert [t.name for t in step.targets] == ["q", "k", "v"]


@pytest.mark.parametrize(
    ("text", "where", "fragment"),
    [
        ("rule a { forward { f($x) -> } }", "1:29", "unexpected '}'"),
        ("rule a { forward { f($x) -> $y } => { g($z) } }", "1:39", "unbound variable(s) $z"),
        ("rule a { forward { f($x)", "1:25", "unexpected end of input"),
        ("rule a { init { f($x) } }", "1:17", "must be marked with '@'"),
        ('rule a { bogus: "x" }', "1:10", "unexpected 'bogus'"),
        ("rule a { forward { f(%) } }", "1:22", "unexpected character '%'"),
        ("rule a { }", "1:1", "neither an init nor a forward"),
        ("rule a { forward { f($x) } }\nrule a { forward { f($x) } }", "2:1", "defined twice"),
        ('rule a { site: "init" forward { f($x) } }', "1:1", "site 'init'"),
        ("rule a { init { @f() -> $m } init { @g() -> $m } forward { $m($x) } }", "1:30", "twice"),
        ("rule a { forward { f($x) } init { @g() -> $m } }", "1:1", "no 'forward' section"),
        ("rule a { forward { f($x) } forward { g($x) -> $y } => { h($z) } }", "1:57", "$z"),
    ],
)
def test_errors_are_located(text, where, fragment):
    with pytest.raises(DslError) as caught:
        parse_rules(text, "bad.adopt")
    message = str(caught.value)
    assert message.startswith(f"bad.adopt:{where}:"), message
    assert fragment in message


def test_rule_file_errors(tmp_path):
    with pytest.raises(DslError, match="rule file not found"):
        load_rule_file(tmp_path / "missing.adopt")
    bad = tmp_path / "latin.adopt"
    bad.write_bytes(b"# caf\xe9\nrule a { forward { f($x) } }")
    with pytest.raises(DslError, match=r"latin.adopt:1:\d+: rule file is not valid UTF-8"):
        load_rule_file(bad)


def test_rule_file_keeps_header_as_doc(tmp_path, monkeypatch):
    # Loading checks that the third-party kernel's package is on the import path.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "r.adopt"
    path.write_text(RULE)
    (rule,) = load_rule_file(path)
    assert rule.doc == "A rule with everything."
    assert rule.source == str(path)


names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda n: n not in {"rule", "init", "forward", "where", "name", "site", "kernel"}
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(names, min_size=1, max_size=3), names, st.lists(names, max_size=3)),
        min_size=1,
        max_size=4,
    )
)
def test_sequences_round_trip(parts):
    text = "; ".join(
        f"{'.'.join(callee)}({', '.join('$' + a for a in args)}) -> ${out}"
        for callee, out, args in parts
    )
    steps = parse_sequence(text)
    assert format_sequence(steps).replace(";\n", "; ") == text
    again = parse_sequence(format_sequence(steps))
    assert [str(s) for s in again] == [str(s) for s in steps]


GUARDED = """
rule demo.2 {
    init { @torch.nn.Linear(...) -> $head }
    forward {
        $head($h) -> $logits;
        self.loss_function(logits=$logits, labels=$labels, ...) -> $loss
    } => if pkg.applies(self, $labels, ...) {
        None -> $logits;
        pkg.loss($h, $head, $labels, ...) -> $loss
    }
}
"""


VARIANTS = """
rule a {
    name: "norm-act"
    init { @Norm(...) -> $norm; @activation(...) -> $act }
    forward { $norm($x) -> $n; $act($n) -> $out } => { k($x, $norm, $act) -> $out }
    init { @NormAct(...) -> $norm }
    forward { $norm($x) -> $out } => { k($x, $norm) -> $out }
    forward { f($x) -> $out } => _
}
"""


def test_further_init_forward_pairs_are_variants_of_the_rule():
    (rule,) = parse_rules(VARIANTS)
    assert [len(s.forward.steps) for s in rule.spellings] == [2, 1, 1]
    assert [str(s.init.steps[0]) if s.init else None for s in rule.spellings] == [
        "@Norm(...) -> $norm",
        "@NormAct(...) -> $norm",
        None,  # a forward without an init section right before it has none
    ]
    assert {(s.id, s.name) for s in rule.spellings} == {("a", "norm-act")}
    assert rule.spellings[2].detect_only and not rule.detect_only


def test_guarded_replacement_with_a_literal_step():
    (rule,) = parse_rules(GUARDED)
    assert str(rule.forward.guard) == "pkg.applies(self, $labels, ...)"
    assert [str(step) for step in rule.forward.replacement] == [
        "None -> $logits",
        "pkg.loss($h, $head, $labels, ...) -> $loss",
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("rule a { forward { f($x) -> $y } => if g($z) { k($x) -> $y } }", "unbound variable"),
        ("rule a { forward { f($x) -> $y } => if g($x) { None -> $y } }", "calls no kernel"),
        ("rule a { forward { f($x) -> $y } => if g($x) { None } }", "exactly one target"),
        ("rule a { forward { f($x) -> $y } => { None -> $y } }", "must be a call"),
        ("rule a { init { @f() -> $m } => if g() { @k() -> $m } }", "cannot be guarded"),
    ],
)
def test_guarded_replacement_errors(text, fragment):
    with pytest.raises(DslError) as caught:
        parse_rules(text, "bad.adopt")
    assert fragment in str(caught.value)


def test_attribute_of_a_variable_and_block_scope():
    (rule,) = parse_rules(
        """
        rule demo.3 {
            scope: "block"
            forward { repeat_kv($k, $module.groups) -> $r } => { pkg.k($module, $k) -> $r }
        }
        """
    )
    assert rule.scope == "block"
    assert str(rule.forward.steps[0]) == "repeat_kv($k, $module.groups) -> $r"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('rule a { scope: "file" forward { f($x) -> $y } => { k($x) -> $y } }', "scope is one of"),
        ('rule a { scope: "block" forward { f($x) -> $y } => _ }', "needs a forward replacement"),
    ],
)
def test_scope_errors(text, fragment):
    with pytest.raises(DslError) as caught:
        parse_rules(text, "bad.adopt")
    assert fragment in str(caught.value)


def test_reciprocal_names_a_variable_a_mul_step_multiplies_by():
    (rule,) = parse_rules(
        """
        rule demo.4 {
            reciprocal: "$scaling"
            forward { mul($scores, $scaling) -> $s } => { pkg.k($scores, $scaling) -> $s }
        }
        """
    )
    assert rule.reciprocal == ("scaling",)
    with pytest.raises(DslError) as caught:
        parse_rules(
            """
            rule demo.5 {
                reciprocal: "$scores"
                forward { mul($scores, $scaling) -> $s } => { pkg.k($scores, $scaling) -> $s }
            }
            """,
            "bad.adopt",
        )
    assert "reciprocal $scores is no mul step's second operand" in str(caught.value)


def test_given_names_a_variable_every_guard_is_handed():
    (rule,) = parse_rules(
        """
        rule demo.6 {
            given: "$labels"
            forward { f($x, $labels) -> $y } => if pkg.applies($labels) { pkg.k($x, $labels) -> $y }
        }
        """
    )
    assert rule.given == ("labels",)
    with pytest.raises(DslError) as caught:
        parse_rules(
            """
            rule demo.7 {
                given: "$x"
                forward { f($x, $labels) -> $y } => if pkg.applies($labels) { pkg.k($x, $labels) -> $y }
            }
            """,
            "bad.adopt",
        )
    assert "given $x is not handed to every spelling's guard" in str(caught.value)
