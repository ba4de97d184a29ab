"""The Adopter DSL: model-structure sequences and ``pattern => replacement`` rules."""

from .declared import check_declared_kernels
from .errors import DslError, LocatedError
from .loading import leading_comment, load_rule_file, parse_rules, parse_sequence
from .syntax import (
    DETECT_ONLY,
    Call,
    CallPattern,
    Index,
    Keyword,
    Literal,
    Name,
    Positional,
    Rest,
    Rule,
    Section,
    Step,
    Var,
    Wildcard,
    format_sequence,
)

__all__ = [
    "DETECT_ONLY",
    "Call",
    "CallPattern",
    "DslError",
    "Index",
    "Keyword",
    "Literal",
    "LocatedError",
    "Name",
    "Positional",
    "Rest",
    "Rule",
    "Section",
    "Step",
    "Var",
    "Wildcard",
    "check_declared_kernels",
    "format_sequence",
    "leading_comment",
    "load_rule_file",
    "parse_rules",
    "parse_sequence",
]
