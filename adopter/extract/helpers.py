"""Canonical helpers: module-level functions whose whole body is a known tensor operation.

Model files define the same small helpers again and again (transformers: ``rotate_half`` in
some 180 files, ``repeat_kv`` in some 170), under the same or other names, and a function of the
same name may compute something else (about 25 files call the interleaved pair rotation
``rotate_half``). Extraction therefore recognises a helper by what its body computes, not by
its name: a called module-level function whose body equals one of the templates below - up to
the names of its parameters and locals, annotations, docstring, import aliases and a slice
start of ``0`` - is recorded as one step of the canonical kind (``helper.rotate_half(q)``)
instead of being inlined, so a rule can name the operation. Its arguments are recorded in the
order of its parameters, keywords moved to their place and omitted ones given their default, so
``f(n, s, m, is_causal=c)`` and ``f(n, s, m, c)`` are the same step. Parameter defaults belong
to the body (they must equal the template's); the only decorators allowed are those that merely
register the function with a tracer and return it unchanged (``torch.fx.wrap``, timm's
``register_notrace_function``). The kinds carry the prefix
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
        # the halves taken by ``chunk`` (timm's ``rope_rotate_half``)
        """
def f(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
""",
        """
def f(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)
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
        # in one expression, the pairs folded back by ``reshape`` to the input's shape (timm's
        # ``rot``): the stacked (..., d / 2, 2) tensor has d elements in the last two dims
        """
def f(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), -1).reshape(x.shape)
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
    # timm's ``resolve_self_attn_mask``: the additive bias SDPA would apply for self-attention
    # of ``n`` tokens - causal (precedence over the mask), a boolean keep-mask as -inf where
    # False, a float mask as it is. It reads the scores only for their dtype and device.
    "helper.self_attn_bias": (
        """
def f(seq_len, attn, attn_mask=None, is_causal=False):
    if is_causal:
        attn_bias = attn.new_full((seq_len, seq_len), float('-inf')).triu_(1)
    elif attn_mask is None:
        attn_bias = None
    elif attn_mask.dtype == torch.bool:
        attn_bias = torch.zeros_like(attn_mask, dtype=attn.dtype)
        attn_bias.masked_fill_(~attn_mask, float('-inf'))
    else:
        attn_bias = attn_mask
    return attn_bias
""",
    ),
    # an additive mask applied when there is one (timm's ``maybe_add_mask``)
    "helper.maybe_add_mask": (
        """
def f(scores, attn_mask=None):
    return scores if attn_mask is None else scores + attn_mask
""",
    ),
}

# decorators that register a function with a tracer and return it unchanged
TRACER_REGISTRATIONS = frozenset({"torch.fx.wrap"})
TRACER_REGISTRATION_NAMES = frozenset({"register_notrace_function"})


def _tracer_registration(decorator: ast.expr, imports: ImportTable | None) -> bool:
    if not isinstance(decorator, (ast.Name, ast.Attribute)):
        return False  # a decorator built by a call may do anything
    name = imports.resolve(decorator) if imports is not None else ast.unparse(decorator)
    if name is None:
        return False
    return name in TRACER_REGISTRATIONS or name.rsplit(".", 1)[-1] in TRACER_REGISTRATION_NAMES


class _Normaliser(ast.NodeTransformer):
    """Renames parameters to ``p0..``, locals to ``v0..`` (in order of first binding), resolves
    global names through the imports, folds dotted names into one ``Name`` and reads a list
    display as a tuple."""

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

    def visit_List(self, node: ast.List) -> ast.AST:  # noqa: N802 - ast visitor name
        # a list display read as a sequence (``torch.cat([a, b])``) is the same as a tuple
        self.generic_visit(node)
        if isinstance(node.ctx, ast.Load):
            return ast.Tuple(elts=node.elts, ctx=ast.Load())
        return node

    def visit_Slice(self, node: ast.Slice) -> ast.AST:  # noqa: N802 - ast visitor name
        self.generic_visit(node)
        lower = node.lower
        if isinstance(lower, ast.Constant) and lower.value == 0 and lower.value is not False:
            node.lower = None
        return node


def _shape(function: ast.FunctionDef, imports: ImportTable | None) -> str | None:
    """The body of a plain function of positional parameters, normalised; ``None`` otherwise."""
    arguments = function.args
    if arguments.vararg or arguments.kwarg or arguments.kwonlyargs:
        return None
    if not all(_tracer_registration(d, imports) for d in function.decorator_list):
        return None
    body = list(function.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    parameters = [arg.arg for arg in [*arguments.posonlyargs, *arguments.args]]
    normaliser = _Normaliser(parameters, imports)
    try:
        statements = [normaliser.visit(ast.parse(ast.unparse(s)).body[0]) for s in body]
        defaults = [ast.dump(ast.parse(ast.unparse(d), mode="eval")) for d in arguments.defaults]
    except (SyntaxError, ValueError, RecursionError):
        return None
    module = ast.dump(ast.Module(body=statements, type_ignores=[]), include_attributes=False)
    return f"{module} defaults={defaults}"


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
