"""Which names a kernel import may take without capturing, or being captured by, other code.

A kernel is imported once at the top of the module (``from adopter.kernels import softmax``)
and called by that name inside the functions the rewrite edits. The name is safe only when,
inside every edited function, it still means the import:

* no binding in that function or in a function around it (parameters, assignments, loop,
  ``with``/``except``/``match`` targets, walrus, imports, nested ``def``/``class``, ``del``,
  ``global``/``nonlocal``) shadows it: Python would look the call up there instead;
* no other module-level binding (or ``from x import *``, which may bind anything) rebinds it;
* no code elsewhere in the module reads a global or builtin of that name: the import would
  change what that code calls.

Class bodies do not count: their names are not visible inside methods. Comprehensions do not
count either: their targets live in a scope of their own, and the call is never inserted there.
Everything here is read from the ``ast``; nothing of the analysed code is imported or run.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda

# ``from x import *`` binds names nobody can list: any kernel name may be among them.
STAR = "*"
ALIAS_PREFIX = "adopter_"  # what fresh_alias puts before a kernel's name


def _targets(node: ast.AST) -> Iterator[str]:
    """Names a statement or expression binds in the scope it is in (not in nested scopes)."""
    for child in _own_scope_nodes(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
            yield child.id
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield child.name
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            for alias in child.names:
                yield STAR if alias.name == "*" else (alias.asname or alias.name).split(".")[0]
        elif isinstance(child, ast.ExceptHandler) and child.name:
            yield child.name
        elif isinstance(child, (ast.MatchAs, ast.MatchStar)) and child.name:
            yield child.name
        elif isinstance(child, ast.MatchMapping) and child.rest:
            yield child.rest
        elif isinstance(child, (ast.Global, ast.Nonlocal)):
            yield from child.names


def _own_scope_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """``node``'s descendants that belong to its scope: a nested function, class, lambda or
    comprehension is yielded itself (its name, its decorators and defaults are evaluated here)
    but not entered."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        yield child
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack.extend(child.decorator_list)
            stack.extend(_defaults(child.args))
            continue
        if isinstance(child, ast.Lambda):
            stack.extend(_defaults(child.args))
            continue
        if isinstance(child, ast.ClassDef):
            stack.extend(child.decorator_list + child.bases + [k.value for k in child.keywords])
            continue
        if isinstance(child, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            # The first iterable is evaluated in the enclosing scope; a walrus in a
            # comprehension binds there too.
            stack.append(child.generators[0].iter)
            stack.extend(n.target for n in ast.walk(child) if isinstance(n, ast.NamedExpr))
            continue
        stack.extend(ast.iter_child_nodes(child))


def _defaults(arguments: ast.arguments) -> list[ast.expr]:
    return [d for d in arguments.defaults + arguments.kw_defaults if d is not None]


def _parameters(function: Function) -> Iterator[str]:
    arguments = function.args
    for argument in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
        yield argument.arg
    for argument in (arguments.vararg, arguments.kwarg):
        if argument is not None:
            yield argument.arg


def function_bindings(function: Function) -> set[str]:
    """Every name bound in ``function``'s own scope, parameters included."""
    body: Iterable[ast.AST] = [function.body] if isinstance(function, ast.Lambda) else function.body
    names = set(_parameters(function))
    for statement in body:
        names.update(_targets(_Wrapper(statement)))
    return names


class _Wrapper(ast.AST):
    """Lets :func:`_targets` look at a statement itself, not only at its children."""

    _fields = ("node",)

    def __init__(self, node: ast.AST) -> None:
        super().__init__()
        self.node = node


def module_bindings(tree: ast.Module) -> Counter[str]:
    """How often each name is bound at module level (``*`` for a star import)."""
    return Counter(name for statement in tree.body for name in _targets(_Wrapper(statement)))


def _functions_with_chain(tree: ast.Module) -> Iterator[tuple[Function, list[Function]]]:
    """Each function of the module with the functions around it (outermost first); classes in
    between are skipped, as Python's name lookup skips them."""
    stack: list[tuple[ast.AST, list[Function]]] = [(tree, [])]
    while stack:
        node, chain = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield child, chain
                stack.append((child, [*chain, child]))
            else:
                stack.append((child, chain))


def global_reads(tree: ast.Module, wanted: Callable[[str], bool] | None = None) -> set[str]:
    """Names the module reads from its global (or builtin) namespace anywhere: at module level,
    in class bodies, and in functions where no enclosing function binds them. ``wanted``
    limits the answer to the names it accepts; the scopes are only worked out when the module
    mentions such a name at all (most modules never mention a kernel's name)."""
    if wanted is not None and not any(
        isinstance(node, ast.Name) and wanted(node.id) for node in ast.walk(tree)
    ):
        return set()
    functions = list(_functions_with_chain(tree))
    bindings = {id(function): function_bindings(function) for function, _ in functions}
    owner: dict[int, list[Function]] = {}
    for function, chain in functions:
        for node in _own_scope_nodes(function):
            owner[id(node)] = [*chain, function]
    reads: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if wanted is not None and not wanted(node.id):
                continue
            chain = owner.get(id(node), [])
            if not any(node.id in bindings[id(function)] for function in chain):
                reads.add(node.id)
    return reads


def visible_bindings(tree: ast.Module, host_lines: Iterable[int]) -> set[str]:
    """Names bound in the functions that hold any of ``host_lines`` (a line of an edited
    statement) or in a function around one of them."""
    lines = set(host_lines)
    names: set[str] = set()
    for function, chain in _functions_with_chain(tree):
        start, end = function.lineno, function.end_lineno or function.lineno
        if any(start <= line <= end for line in lines):
            for scope in (*chain, function):
                names |= function_bindings(scope)
    return names


def names_a_kernel_import_must_avoid(
    tree: ast.Module, visible: set[str], kernels: Iterable[str] | None = None
) -> set[str]:
    """Module bindings, global reads, and ``visible``: the :func:`visible_bindings` of the
    places kernels will be called. Given ``kernels`` (the names that may be imported), the
    global reads are only those of these names and of their :func:`fresh_alias` spellings,
    the only names the answer is asked about."""
    wanted = None
    if kernels is not None:
        names = set(kernels)

        def wanted(name: str) -> bool:
            return name in names or name.startswith(ALIAS_PREFIX)

    return set(module_bindings(tree)) | global_reads(tree, wanted) | visible


def fresh_alias(name: str, taken: set[str]) -> str:
    """``adopter_<name>``, or ``adopter_<name>_2``, ... : the first one ``taken`` lacks."""
    candidate = f"{ALIAS_PREFIX}{name}"
    number = 2
    while candidate in taken:
        candidate = f"{ALIAS_PREFIX}{name}_{number}"
        number += 1
    return candidate
