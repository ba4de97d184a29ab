"""Static structure extraction: parse model source (never import it) and describe each module
class as ``__init__`` constructions plus data-flow-linked call steps of its methods."""

from .model import (
    ClassInfo,
    Construction,
    FileStructure,
    Flow,
    FunctionFlow,
    ModuleRef,
    Operand,
    Step,
    Use,
    consistent,
)
from .source import SourceError, decode_source, failure_as_error, parse_source, read_source
from .structure import FileAnalysis, analyse_file, analyse_source

__all__ = [
    "ClassInfo",
    "Construction",
    "FileAnalysis",
    "FileStructure",
    "Flow",
    "FunctionFlow",
    "ModuleRef",
    "Operand",
    "SourceError",
    "Step",
    "Use",
    "analyse_file",
    "analyse_source",
    "consistent",
    "decode_source",
    "failure_as_error",
    "parse_source",
    "read_source",
]
