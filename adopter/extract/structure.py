"""Whole-file structure extraction: classes, which of them are modules, their ``__init__``
bindings and the data flow of each method. Parses with :mod:`ast`; never imports the code."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from functools import lru_cache, partial

from .callers import CallerClasses
from .constructions import SEQUENTIAL, InitAnalyzer, InitContext
from .flow import FlowBuilder
from .helpers import canonical_helper
from .model import (
    BranchPoint,
    ClassInfo,
    Construction,
    FileStructure,
    FunctionFlow,
    ModuleRef,
)
from .names import ImportTable
from .project import project_for
from .source import SourceError, parse_source, read_source, split_lines

# Bases that make a class a module without seeing their source.
MODULE_BASES = ("torch.nn.Module",)
MODULE_BASE_SUFFIXES = ("PreTrainedModel", "Module", "Layer", "Block", "Model")


# `self.name` not followed by a call parenthesis: a method used as a value.
_METHOD_REFERENCE = re.compile(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\()")


class FileAnalysis:
    """Analyses one parsed module; ``opaque_methods`` are method names kept as steps."""

    def __init__(
        self,
        tree: ast.Module,
        path: str,
        opaque_methods: Iterable[str] = (),
        text: str = "",
    ) -> None:
        self.tree = tree
        self.lines = split_lines(text)  # numbered as ``ast`` numbers them
        self.path = path
        self.opaque_methods = frozenset(name.removeprefix("self.") for name in opaque_methods)
        self.imports = ImportTable()
        self.project = project_for(path)
        self.functions: dict[str, ast.FunctionDef] = {}
        self.class_nodes: dict[str, ast.ClassDef] = {}
        self.classes: dict[str, ClassInfo] = {}
        self._branch = 0
        self._helpers: dict[int, str | None] = {}
        self._imported_helpers: dict[str, tuple[str, ast.FunctionDef] | None] = {}
        # module classes of other files of the package, by the name this file imports
        self.foreign_classes: dict[str, ClassInfo] = {}
        self.branch_labels: dict[int, BranchPoint] = {}
        self._collect(tree.body)
        self.callers = CallerClasses(self.class_nodes, self.imports)

    def canonical_helper(self, function: ast.FunctionDef) -> str | None:
        """The canonical operation a module-level function of this file computes, if any."""
        key = id(function)
        if key not in self._helpers:
            self._helpers[key] = canonical_helper(function, self.imports)
        return self._helpers[key]

    def imported_helper(self, name: str) -> tuple[str, ast.FunctionDef] | None:
        """The canonical operation of a function imported from another file of the package
        (``from ..llama.modeling_llama import rotate_half``), read from that file, with the
        function's definition (its parameters order the step's arguments)."""
        if name not in self._imported_helpers:
            found = None
            if self.project.enabled and self.project.file is not None:
                found = self.project.lookup(self.imports, self.project.file, name)
            helper = None
            if found is not None and isinstance(found.node, ast.FunctionDef):
                kind = canonical_helper(found.node, found.module.imports)
                helper = (kind, found.node) if kind is not None else None
            self._imported_helpers[name] = helper
        return self._imported_helpers[name]

    def next_branch(self) -> int:
        self._branch += 1
        return self._branch

    def _collect(self, statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.imports.add(node)
            elif isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.class_nodes[node.name] = node
            elif isinstance(node, ast.If):
                self._collect(node.body)
                self._collect(node.orelse)
            elif isinstance(node, ast.Try):
                self._collect(node.body)
                for handler in node.handlers:
                    self._collect(handler.body)
                self._collect(node.orelse)

    # -- classes -----------------------------------------------------------------------------
    def local_class(self, kind: str) -> ClassInfo | None:
        info = self.classes.get(kind)
        return info if info is not None and info.is_module else None

    def module_class(self, kind: str) -> ClassInfo | None:
        """A module class of this file, or one of another file that an annotation named
        (``attn: Attention`` imported from ``attention_processor.py``): for its submodules and
        method names only; its code is never inlined here (its lines are another file's)."""
        return self.local_class(kind) or self.foreign_classes.get(kind)

    def imported_module_class(self, name: str) -> ClassInfo | None:
        """The module class a name this file imports from its package stands for, read
        statically from that file (its ``__init__`` bindings), or ``None``."""
        if not self.project.enabled or self.project.file is None:
            return None
        found = self.project.lookup(self.imports, self.project.file, name)
        if found is None or not isinstance(found.node, ast.ClassDef):
            return None
        foreign = _foreign_class(str(found.module.path), found.name, found.module.digest)
        if foreign is None:
            return None
        info, labels = foreign
        self.foreign_classes[info.name] = info
        self.branch_labels.update(labels)  # what its constructions' contexts name
        return info

    def _base_names(self, node: ast.ClassDef) -> list[str]:
        return [name for base in node.bases if (name := self.imports.resolve(base)) is not None]

    def _is_module(self, name: str, seen: set[str]) -> bool:
        node = self.class_nodes.get(name)
        if node is None or name in seen:
            return False
        seen.add(name)
        for base in self._base_names(node):
            if base in self.class_nodes:
                if self._is_module(base, seen):
                    return True
            elif base.startswith("torch.nn.") or base in MODULE_BASES:
                return True
            elif base.split(".")[-1].endswith(
                MODULE_BASE_SUFFIXES
            ) and "." in self.imports.aliases.get(base.split(".")[0], base):
                return True
        for base_node in node.bases:
            if isinstance(base_node, ast.Name) and self._imported_module_class(base_node.id):
                return True
        return False

    def _imported_module_class(self, name: str) -> bool:
        """A base class imported from another file of the package that is an ``nn.Module``
        (diffusers' ``ModelMixin``), read from that file."""
        if not self.project.enabled or self.project.file is None:
            return False
        found = self.project.lookup(self.imports, self.project.file, name)
        seen: set[tuple[str, str]] = set()
        pending = [found] if found is not None else []
        while pending:
            definition = pending.pop()
            key = (str(definition.module.path), definition.name)
            if key in seen or len(seen) > 8 or not isinstance(definition.node, ast.ClassDef):
                continue
            seen.add(key)
            for base in definition.node.bases:
                resolved = definition.module.imports.resolve(base)
                if resolved is not None and (
                    resolved.startswith("torch.nn.") or resolved in MODULE_BASES
                ):
                    return True
                if isinstance(base, ast.Name):
                    parent = self.project.lookup_in(definition.module, base.id)
                    if parent is not None:
                        pending.append(parent)
        return False

    def local_parents(self, info: ClassInfo) -> list[ClassInfo]:
        """The class's ancestors defined in this file, nearest first (a simple MRO)."""
        order: list[ClassInfo] = []
        pending = [b for b in info.bases if b in self.classes]
        while pending:
            name = pending.pop(0)
            parent = self.classes[name]
            if parent not in order:
                order.append(parent)
                pending.extend(b for b in parent.bases if b in self.classes)
        return order

    def method(self, info: ClassInfo, name: str) -> ast.FunctionDef | None:
        if name in info.methods:
            return info.methods[name]
        if info.path != self.path:  # another file's class: its parents are not ours
            return None
        for parent in self.local_parents(info):
            if name in parent.methods:
                return parent.methods[name]
        return None

    def parent_method(self, info: ClassInfo, name: str) -> ast.FunctionDef | None:
        for parent in self.local_parents(info):
            if name in parent.methods:
                return parent.methods[name]
        return None

    def _class_infos(self) -> None:
        for name, node in self.class_nodes.items():
            self.classes[name] = ClassInfo(
                name=name,
                path=self.path,
                line=node.lineno,
                bases=self._base_names(node),
                is_module=self._is_module(name, set()),
                node=node,
                methods={
                    item.name: item
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                },
            )

    def analyse(self) -> FileStructure:
        self._class_infos()
        done: set[str] = set()
        for info in self.classes.values():
            self._bind(info, done)
        structure = FileStructure(
            path=self.path,
            classes=self.classes,
            imports=self.imports.aliases,
            branch_labels=self.branch_labels,
            wide_lines={
                number: line for number, line in enumerate(self.lines, 1) if not line.isascii()
            },
            tree=self.tree,
        )
        for info in self.classes.values():
            self._processor_flows(info)
            if not info.is_module:
                continue
            for name in [
                *self._entry_points(info),
                *self._method_references(info),
                *self._opaque_callees(info),
            ]:
                function = self.method(info, name)
                if isinstance(function, ast.FunctionDef) and name not in info.flows:
                    info.flows[name] = self._flow(info, function)
        # Module-level functions run too (transformers 5.x computes attention in
        # ``eager_attention_forward``, reached through ``ALL_ATTENTION_FUNCTIONS``); their sites
        # are reported in the function, whoever calls it.
        for name, function in self.functions.items():
            structure.functions[name] = self._flow(None, function)
        self._container_flows(structure)
        return structure

    # -- nn.Sequential containers no forward call expands ----------------------------------------
    def _container_flows(self, structure: FileStructure) -> None:
        """``nn.Sequential.forward`` runs the elements in order, whoever calls it. A forward
        call expands a container's elements only where the attribute holds that one container;
        a container that is one of several modules an attribute may hold (timm ResNet's
        ``self.conv1``: a deep-stem ``nn.Sequential`` or one ``nn.Conv2d``), or that a
        module-level function builds and returns (``downsample_conv``), is analysed as a flow
        of its own: input, element 0, element 1, ... Its sites are reported at the elements;
        they are not rewritten (no call in this file runs that container alone)."""
        for info in self.classes.values():
            if not info.is_module:
                continue
            for attr, alternatives in list(info.bindings.items()):
                if len(alternatives) < 2:
                    continue
                for construction in alternatives:
                    if construction.container == "sequential" and construction.elements:
                        key = f"{attr} = nn.Sequential (line {construction.line})"
                        reason = (
                            f"`self.{attr}` may hold this nn.Sequential (line "
                            f"{construction.line}) or another module; only that container's "
                            "own elements fuse, and no call runs it alone: not rewritten"
                        )
                        info.flows[key] = self._container_flow(
                            info.name, construction, f"self.{attr}", reason
                        )
        # A factory a class of this file calls is analysed through that class's calls (the
        # names those classes call are collected only when some function returns a container).
        called_by_classes: set[str] | None = None
        for name, function in self.functions.items():
            returned = self._returned_calls(function)
            if not any(self.imports.resolve(v.func) == SEQUENTIAL for v in returned):
                continue
            if called_by_classes is None:
                called_by_classes = {
                    node.func.id
                    for cls in self.class_nodes.values()
                    for node in ast.walk(cls)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                }
            if name in called_by_classes:
                continue
            for construction in self._returned_sequentials(function, returned):
                reason = (
                    f"`{name}` builds this nn.Sequential (line {construction.line}) for its "
                    "caller; the call that runs it is elsewhere: not rewritten"
                )
                structure.functions[f"{name} (nn.Sequential, line {construction.line})"] = (
                    self._container_flow(None, construction, f"{name}()", reason, name)
                )

    @staticmethod
    def _returned_calls(function: ast.FunctionDef) -> list[ast.Call]:
        """The calls a function returns (``return nn.Sequential(...)``): a cheap pre-check."""
        return [
            node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Call)
        ]

    def _returned_sequentials(
        self, function: ast.FunctionDef, returned: list[ast.Call]
    ) -> list[Construction]:
        """The ``nn.Sequential`` containers a module-level function returns (``returned``: the
        calls its ``return`` statements return)."""
        context = InitContext(
            imports=self.imports,
            path=self.path,
            functions=self.functions,
            methods=lambda name: None,
            next_branch=self.next_branch,
            branch_labels=self.branch_labels,
            class_nodes=self.class_nodes,
            project=self.project if self.project.enabled else None,
            module_path=self.project.file,
        )
        analyzer = InitAnalyzer(context, {})
        analyzer.run(function)
        analyzer.method_stack.append(function.name)
        analyzer.function_stack.append(function)
        found = []
        for value in returned:
            if self.imports.resolve(value.func) != SEQUENTIAL:
                continue
            for construction in analyzer.construct(value):
                if construction.container == "sequential" and construction.elements:
                    found.append(construction)
        return found

    def _container_flow(
        self,
        cls: str | None,
        container: Construction,
        path: str,
        reason: str,
        method: str | None = None,
    ) -> FunctionFlow:
        """The flow of ``container``'s own ``forward``, built from a two-line stand-in
        ``def forward(container, x): return container(x)`` located at the container."""
        call = ast.Call(ast.Name("container", ast.Load()), [ast.Name("x", ast.Load())], [])
        function = ast.FunctionDef(
            name=method or container.method,
            args=ast.arguments(
                posonlyargs=[],
                args=[ast.arg("container"), ast.arg("x")],
                kwonlyargs=[],
                kw_defaults=[],
                defaults=[],
            ),
            body=[ast.Return(call)],
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        anchor = container.node if container.node is not None else ast.Pass(lineno=container.line)
        for node in ast.walk(function):
            ast.copy_location(node, anchor)
        flow = FunctionFlow(
            cls=cls,
            method=function.name,
            path=self.path,
            line=container.line,
            branch_labels=self.branch_labels,
            report_only=reason,
        )
        ref = ModuleRef(path, [container])
        built = FlowBuilder(self, flow).build_root(None, function, {"container": ref})
        for step in built.steps:  # reported in the class whose ``__init__`` built it
            step.cls = cls
        return built

    def _entry_points(self, info: ClassInfo) -> list[str]:
        """``forward`` and the other methods that run a module's computation from outside:
        ``forward_features``, ``forward_head``, ``forward_intermediates`` (timm),
        ``forward_pre``/``forward_post``... (every ``forward_*`` of the class or its local
        parents)."""
        names = ["forward"]
        for owner in [info, *self.local_parents(info)]:
            names += [n for n in owner.methods if n.startswith("forward_") and n not in names]
        return names

    def _opaque_callees(self, info: ClassInfo) -> list[str]:
        """Methods a rule names as ``method.<name>``: called on a submodule they stay one step
        of the caller's flow instead of being inlined there, so each is analysed as a root of
        its own (its own sites are found in it, as when the caller inlined it)."""
        return [
            name
            for name in info.methods
            if f"method.{name}" in self.opaque_methods and name != "forward"
        ]

    def _processor_flows(self, info: ClassInfo) -> None:
        """A class whose ``__call__`` receives a module of this file as a parameter (diffusers'
        attention processors, plain classes or ``nn.Module``s: ``__call__(self, attn:
        Attention, hidden_states)``) runs that module's computation: analyse it with the
        parameter bound to the module."""
        function = info.methods.get("__call__")
        if not isinstance(function, ast.FunctionDef):
            return
        bound = {}
        elsewhere = False  # a module of another file, named in quotes (``attn: "MochiAttention"``)
        for arg in [*function.args.posonlyargs, *function.args.args][1:]:
            annotation = arg.annotation
            quoted = isinstance(annotation, ast.Constant) and isinstance(annotation.value, str)
            if quoted:
                annotation = ast.Name(annotation.value)  # a quoted forward reference
            kind = self.imports.resolve(annotation) if annotation is not None else None
            owner = self.classes.get(kind or "")
            if owner is None and isinstance(annotation, ast.Name) and not quoted:
                foreign = self.imported_module_class(annotation.id)
                if foreign is not None and foreign.name not in self.classes:
                    owner = foreign
            if owner is not None and owner.is_module:
                bound[arg.arg] = owner
            elif quoted and owner is None and arg is function.args.args[1]:
                elsewhere = True
        if bound or elsewhere:
            flow = FunctionFlow(
                cls=info.name,
                method=function.name,
                path=self.path,
                line=function.lineno,
                branch_labels=self.branch_labels,
            )
            info.flows["__call__"] = FlowBuilder(self, flow).build_root(info, function, bound)

    def _method_references(self, info: ClassInfo) -> list[str]:
        """Methods the class passes around rather than calls: stored by ``__init__``
        (``self.attn = self.dense_attn``, dispatch tables) or handed to a helper
        (``apply_chunking_to_forward(self.ff_chunk, ...)``). ``forward`` reaches them indirectly,
        so each is analysed as a root of its own."""
        lines = self.lines[info.node.lineno - 1 : info.node.end_lineno]
        found: list[str] = []
        for match in _METHOD_REFERENCE.finditer("".join(lines)):
            name = match.group(1)
            if name in info.methods and name != "forward" and name not in found:
                found.append(name)
        return found

    def _bind(self, info: ClassInfo, done: set[str]) -> None:
        if info.name in done:
            return
        done.add(info.name)
        inherited: dict[str, list[Construction]] = {}
        for parent in reversed(self.local_parents(info)):
            self._bind(parent, done)
            inherited.update(parent.bindings)
        init = info.methods.get("__init__")
        if not info.is_module or not isinstance(init, ast.FunctionDef):
            info.bindings = inherited
            return
        context = InitContext(
            imports=self.imports,
            path=self.path,
            functions=self.functions,
            methods=lambda name: self.method(info, name),
            next_branch=self.next_branch,
            branch_labels=self.branch_labels,
            class_nodes=self.class_nodes,
            project=self.project if self.project.enabled else None,
            module_path=self.project.file,
            passed_classes=partial(self.callers.parameters, info.name),
        )
        info.bindings = InitAnalyzer(context, inherited).run(init)

    def _flow(self, info: ClassInfo | None, function: ast.FunctionDef) -> FunctionFlow:
        flow = FunctionFlow(
            cls=info.name if info else None,
            method=function.name,
            path=self.path,
            line=function.lineno,
            branch_labels=self.branch_labels,
        )
        return FlowBuilder(self, flow).build_root(info, function)


def analyse_source(
    text: str, path: str = "<string>", opaque_methods: Iterable[str] = ()
) -> FileStructure:
    """Extract the structure of Python source text (raises SourceError on invalid Python)."""
    tree = parse_source(text, path)
    return FileAnalysis(tree, path, opaque_methods, text).analyse()


def analyse_file(path: str, opaque_methods: Iterable[str] = ()) -> FileStructure:
    return analyse_source(read_source(path), path, opaque_methods)


# Branch ids of another file's analysis start far above this file's (each foreign analysis
# gets its own range), so the contexts of its constructions never meet a local branch.
_FOREIGN_BRANCH_RANGE = 1_000_000
_foreign_analyses = [0]


@lru_cache(maxsize=64)
def _foreign_class(
    path: str, name: str, digest: str
) -> tuple[ClassInfo, dict[int, BranchPoint]] | None:
    """Class ``name`` of the package file ``path`` (its content: ``digest``), with its
    ``__init__`` bindings, when it is a module, and the branch points its contexts name;
    parsed, never imported."""
    try:
        text = read_source(path)
        tree = parse_source(text, path)
    except SourceError:
        return None
    analysis = FileAnalysis(tree, path, text=text)
    _foreign_analyses[0] += 1
    analysis._branch = _FOREIGN_BRANCH_RANGE * _foreign_analyses[0]
    analysis._class_infos()
    info = analysis.classes.get(name)
    if info is None or not info.is_module:
        return None
    analysis._bind(info, set())
    return info, analysis.branch_labels
