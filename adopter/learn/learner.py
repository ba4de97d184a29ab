"""``learn``: a rule from before/after examples, checked before it is handed out.

For each example the changed regions are found (:mod:`.diff`) and lifted (:mod:`.lift`); a
region may be lifted in a few ways (leaving out calls the new code still makes, or not; the
replacement standing for the matched calls or for the whole block), and the first way whose rule,
applied to BEFORE, writes AFTER (compared as ASTs) is taken. The examples' spellings are then
anti-unified (:mod:`.generalise`); counter-examples narrow the construction constraints until the
rule no longer matches them. The result parses as DSL, passes the load-time checks every rule
passes (its kernel is registered, the replacement calls only it), and rewrites each example's
BEFORE to its AFTER.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..dsl import DslError, LocatedError, Rule, check_declared_kernels, parse_rules
from ..extract import analyse_source, read_source
from ..match import Matcher, Site
from ..rewrite import rewrite_text
from .diff import KERNEL_PACKAGE, LearnError, Region, find_regions
from .generalise import as_rule, generalise, with_orders
from .lift import LiftOptions, lift_forward, lift_init
from .render import fixture_text, header, rule_text

# The ways a forward region is lifted, in the order tried: the first that reproduces AFTER wins.
_ATTEMPTS = (
    LiftOptions(subtract_kept=True, scope="calls"),
    LiftOptions(subtract_kept=False, scope="calls"),
    LiftOptions(subtract_kept=True, scope="block"),
    LiftOptions(subtract_kept=False, scope="block"),
)
# Construction constraints from the most general to the most specific: a counter-example moves
# the rule along this list until it stops matching. One example keeps the class alone, plus the
# flags the kernel's registry entry declares of what it is handed (`Entry.needs`: the Linear of
# linear_bias_activation has `bias=True`); any other flag is what a counter-example says.
NARROWING = ("class", "flags", "literals")


@dataclass(frozen=True)
class Example:
    before_path: str
    after_path: str
    before: str
    after: str

    @classmethod
    def read(cls, before_path: str | Path, after_path: str | Path) -> Example:
        return cls(
            str(before_path),
            str(after_path),
            _read(before_path),
            _read(after_path),
        )


def _read(path: str | Path) -> str:
    try:
        return read_source(str(path))
    except LocatedError:
        raise
    except OSError as error:
        raise LearnError(str(path), 1, 1, f"cannot read: {error.strerror or error}") from None


@dataclass
class Learned:
    """A checked rule, its rule-file text (header included) and its fixture."""

    rule: Rule
    text: str
    fixture: str
    regions: list[Region] = field(default_factory=list)
    construction_level: str = "flags"


def _kernel_neutral(text: str) -> str:
    """A file as an AST with how the kernel is imported left out: ``from adopter.kernels import
    rms_norm`` + ``rms_norm(...)`` reads the same as ``adopter.kernels.rms_norm(...)``."""

    class Strip(ast.NodeTransformer):
        def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:  # noqa: N802
            if (node.module or "").startswith(KERNEL_PACKAGE):
                return None
            return node

        def visit_Import(self, node: ast.Import) -> ast.AST | None:  # noqa: N802
            if all(alias.name.startswith(KERNEL_PACKAGE) for alias in node.names):
                return None
            return node

        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:  # noqa: N802
            if ast.unparse(node.value) == KERNEL_PACKAGE:
                return ast.copy_location(ast.Name(node.attr, ast.Load()), node)
            return self.generic_visit(node)

    return ast.dump(Strip().visit(ast.parse(text)))


def reproduces(rule: Rule, example: Example) -> tuple[bool, str]:
    """Whether the rule, applied to BEFORE, writes AFTER (modulo formatting); and what it wrote."""
    rewrite = rewrite_text(example.before, example.before_path, Matcher([rule]))
    if rewrite.error is not None:
        return False, rewrite.patched
    try:
        return _kernel_neutral(rewrite.patched) == _kernel_neutral(example.after), rewrite.patched
    except SyntaxError:
        return False, rewrite.patched


def _lift(region: Region, example: Example, options: LiftOptions) -> Rule:
    if region.method == "__init__":
        return lift_init(region, example.before, example.before_path)
    return lift_forward(
        region,
        example.before,
        example.before_path,
        example.after,
        example.after_path,
        options,
    )


def _spellings_of(example: Example, level: str) -> tuple[list[Rule], list[Region]]:
    regions = find_regions(example.before, example.after, example.before_path, example.after_path)
    first_error: LocatedError | None = None
    for attempt in _ATTEMPTS:
        options = replace(attempt, construction_level=level)
        try:
            spellings = [_lift(region, example, options) for region in regions]
        except LocatedError as error:
            first_error = first_error or error
            continue
        merged = generalise(spellings)
        candidate = as_rule(merged, "learned", "learned", "")
        try:
            ok, _ = reproduces(candidate, example)
        except LocatedError as error:
            first_error = first_error or error
            continue
        if ok:
            return _fewest(merged, example), regions
    if first_error is not None:
        raise first_error
    region = regions[0]
    raise LearnError(
        example.before_path,
        region.removed[0],
        1,
        f"no rule lifted from this change rewrites {example.before_path} to "
        f"{example.after_path}: the kernel call does not stand for the removed statements "
        "alone (see docs/learn.md, what the learner cannot express)",
    )


def _fewest(spellings: list[Rule], example: Example) -> list[Rule]:
    """The spellings without those the others already account for: a region whose code another
    spelling matches too (across a branch, say) adds nothing but a narrower pattern."""
    kept = list(spellings)
    for spelling in reversed(spellings):
        if len(kept) == 1:
            break
        trial = [s for s in kept if s is not spelling]
        if reproduces(as_rule(trial, "learned", "learned", ""), example)[0]:
            kept = trial
    return kept


def _rule_name(kernel: str) -> str:
    return kernel.rsplit(".", 1)[-1].replace("_", "-")


def _matches(rule: Rule, path: str, text: str) -> list[Site]:
    matcher = Matcher([rule])
    structure = analyse_source(text, path, matcher.opaque_methods)
    return matcher.match_file(structure)


def learn(
    examples: list[Example],
    rule_id: str = "learned.1",
    counter_examples: list[tuple[str, str]] | None = None,
    constraints: str = NARROWING[0],
) -> Learned:
    """The rule the examples teach, checked; :class:`LearnError` (a ``file:line:col`` error)
    when an example cannot be used or the result fails a check. ``constraints``: how much of
    each construction the rule checks at first (``class``, ``flags``, ``literals``); a
    counter-example the rule matches moves it further along."""
    if not examples:
        raise LearnError("<arguments>", 1, 1, "learn needs at least one BEFORE AFTER pair")
    counters = counter_examples or []
    last_error: LearnError | None = None
    if constraints not in NARROWING:
        raise LearnError("<arguments>", 1, 1, f"constraints {constraints!r}: one of {NARROWING}")
    for level in NARROWING[NARROWING.index(constraints) :]:
        spellings: list[Rule] = []
        regions: list[Region] = []
        for example in examples:
            found, example_regions = _spellings_of(example, level)
            spellings.extend(found)
            regions.extend(example_regions)
        kernels = {s.kernel for s in spellings}
        if len(kernels) > 1:
            raise LearnError(
                examples[0].after_path,
                regions[0].call.line,
                regions[0].call.column,
                f"the examples call different kernels ({', '.join(sorted(kernels))}); a rule "
                "declares one",
            )
        kernel = spellings[0].kernel
        name = _rule_name(kernel)
        description = (
            f"learned from {Path(examples[0].before_path).name}: the code can call {kernel}"
        )
        rule = as_rule(with_orders(generalise(spellings)), rule_id, name, description)
        learned = _checked(rule, examples, regions)
        hits = [
            (path, site) for path, text in counters for site in _matches(learned.rule, path, text)
        ]
        if not hits:
            learned.construction_level = level
            return learned
        path, site = hits[0]
        last_error = LearnError(
            path,
            site.line,
            site.column,
            f"the learned rule still matches this counter-example (in {site.cls or ''}"
            f"{'.' if site.cls else ''}{site.method}) at every level of construction constraints; "
            "give another example that shows the difference",
        )
    assert last_error is not None
    raise last_error


def _checked(rule: Rule, examples: list[Example], regions: list[Region]) -> Learned:
    """Parse the rule's text back, run the load-time checks, and apply it to each example."""
    first = examples[0]
    site = (
        "the construction of the submodule in `__init__`"
        if rule.site == "init"
        else "the first call of the matched computation"
    )
    body = rule_text(rule)
    text = header(
        rule, regions[0].before_code, regions[0].after_code, Path(first.before_path).name, site
    )
    text += "\n" + body
    try:
        parsed = parse_rules(text, f"<learned {rule.id}>")
        check_declared_kernels(parsed)
    except DslError as error:  # a defect of the learner, said at the example
        raise LearnError(
            first.after_path,
            regions[0].call.line,
            regions[0].call.column,
            f"the learned rule does not load: {error}",
        ) from None
    (loaded,) = parsed
    for example in examples:
        ok, wrote = reproduces(loaded, example)
        if not ok:
            raise LearnError(
                example.before_path,
                1,
                1,
                f"the learned rule applied to this file does not write {example.after_path}",
            )
    site_lines = sorted(
        {s.line for s in _matches(loaded, first.before_path, first.before) if s.applicable}
    )
    stem = rule.id.replace(".", "_")
    fixture = fixture_text(loaded, first.before, site_lines, stem)
    return Learned(loaded, text, fixture, regions)
