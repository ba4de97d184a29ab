"""Canonical helpers: module-level functions whose whole body is a known tensor operation.

Model files define the same small helpers again and again (transformers: ``rotate_half`` in
some 180 files, ``repeat_kv`` in some 170), under the same or other names, and a function of the
same name may compute something else (about 25 files call the interleaved pair rotation
``rotate_half``). Extraction therefore recognises a helper by what its body computes, not by
its name: a called module-level function whose body equals one of the templates below - up to
the names of its parameters and locals, annotations, docstring, import aliases and a slice
start of ``0`` - is recorded as one step of the canonical kind (``helper.rotate_half(q)``)
instead of being inlined, so a rule can name the operation. The kinds carry the prefix
``helper.`` so that a rule naming one never matches a call by its name alone (a
``rotate_half`` imported from a file the analysis cannot read is ``that.module.rotate_half``).
A helper imported from another file of the package is known by that file's body.
"""

from __future__ import annotations

import ast
from functools import cache

from .names import ImportTable

# canonical kind -> the spellings of its body (as Python source of a whole function)
TEMPLATES: dict[str, tuple[str, ...]] = {
    # the two halves of the last dimension swapped, the second negated (Llama family)
    "helper.rotate_half": (
        """
def f(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
""",
    ),
    # each pair (2i, 2i+1) of the last dimension rotated in place (GPT-J, GLM)
    "helper.rotate_pairs": (
        """
def f(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)
""",
        """
def f(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)
""",
        """
def f(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    rot_x = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return rot_x
""",
        # the pairs as a trailing dimension of 2, unbound (SAM 2/3, EdgeTAM: rotate_pairwise)
        """
def f(x):
    x = x.view(*x.shape[:-1], -1, 2)
    x1, x2 = x.unbind(dim=-1)
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(start_dim=-2)
""",
    ),
    # grouped-query keys/values repeated per query head: (b, kv, s, d) -> (b, kv * n, s, d)
    "helper.repeat_kv": (
        """
def f(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(
        batch, num_key_value_heads, n_rep, slen, head_dim
    )
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)
""",
    ),
}


class _Normaliser(ast.NodeTransformer):
    """Renames parameters to ``p0..``, locals to ``v0..`` (in order of first binding), resolves
    global names through the imports and folds dotted names into one ``Name``."""

    def __init__(self, parameters: list[str], imports: ImportTable | None) -> None:
        self.names = {name: f"p{index}" for index, name in enumerate(parameters)}
        self.imports = imports

    def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802 - ast visitor name
        if node.id not in self.names and isinstance(node.ctx, (ast.Store, ast.Del)):
            self.names[node.id] = f"v{len(self.names)}"
        if node.id in self.names:
            return ast.Name(id=self.names[node.id], ctx=ast.Load())
        resolved = self.imports.aliases.get(node.id, node.id) if self.imports else node.id
        return ast.Name(id=resolved, ctx=ast.Load())

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:  # noqa: N802 - ast visitor name
        value = self.visit(node.value)
        if isinstance(value, ast.Name) and value.id not in self.names.values():
            return ast.Name(id=f"{value.id}.{node.attr}", ctx=ast.Load())
        return ast.Attribute(value=value, attr=node.attr, ctx=ast.Load())

    def visit_Slice(self, node: ast.Slice) -> ast.AST:  # noqa: N802 - ast visitor name
        self.generic_visit(node)
        lower = node.lower
        if isinstance(lower, ast.Constant) and lower.value == 0 and lower.value is not False:
            node.lower = None
        return node


def _shape(function: ast.FunctionDef, imports: ImportTable | None) -> str | None:
    """The body of a plain function of positional parameters, normalised; ``None`` otherwise."""
    arguments = function.args
    if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.defaults:
        return None
    if function.decorator_list:
        return None
    body = list(function.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    parameters = [arg.arg for arg in [*arguments.posonlyargs, *arguments.args]]
    normaliser = _Normaliser(parameters, imports)
    try:
        statements = [normaliser.visit(ast.parse(ast.unparse(s)).body[0]) for s in body]
    except (SyntaxError, ValueError, RecursionError):
        return None
    return ast.dump(ast.Module(body=statements, type_ignores=[]), include_attributes=False)


@cache
def _template_shapes() -> dict[str, str]:
    shapes: dict[str, str] = {}
    for kind, spellings in TEMPLATES.items():
        for text in spellings:
            function = ast.parse(text.strip()).body[0]
            assert isinstance(function, ast.FunctionDef)
            shape = _shape(function, None)
            assert shape is not None
            shapes[shape] = kind
    return shapes


def canonical_helper(function: ast.FunctionDef, imports: ImportTable) -> str | None:
    """The canonical kind of a module-level function whose body is a known operation."""
    if len(function.body) > 8:  # every template is short; skip the work for real functions
        return None
    shape = _shape(function, imports)
    return _template_shapes().get(shape) if shape is not None else None
