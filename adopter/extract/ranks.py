"""Static tensor ranks, where the code states them: ``einsum`` output specs, ``view``/``reshape``
/``permute`` argument counts, slicing, and ops that keep the rank of their inputs.

Rules speak of "the last dimension" (``dim=-1``); code written for 4-D attention scores often
says ``dim=3``. Knowing the rank lets extraction record such a softmax as ``dim=-1`` too."""

from __future__ import annotations

import ast

from .model import Operand

# Ops whose result has the (broadcast) rank of their tensor operands.
RANK_PRESERVING = {
    "add",
    "sub",
    "mul",
    "truediv",
    "pow",
    "neg",
    "pos",
    "torch.nn.functional.softmax",
    "torch.nn.functional.dropout",
    "torch.nn.Dropout",
    "torch.exp",
    "torch.tanh",
}
# Ops whose result has the rank of their first operand, whatever the others are.
RANK_OF_FIRST = {
    "Tensor.float",
    "Tensor.half",
    "Tensor.type",
    "Tensor.type_as",
    "Tensor.to",
    "Tensor.contiguous",
    "Tensor.transpose",
    "Tensor.masked_fill",
    "Tensor.clone",
    "torch.index_select",
}
# Batched matrix products: always 3-D.
THREE_D = {"torch.bmm", "Tensor.bmm", "torch.baddbmm", "Tensor.baddbmm"}
SHAPE_FROM_ARGUMENTS = {"Tensor.view", "Tensor.reshape", "Tensor.permute", "torch.reshape"}


class RankTracker:
    """Ranks of values, filled in as steps are emitted."""

    def __init__(self) -> None:
        self.ranks: dict[int, int] = {}

    def rank_of(self, operand: Operand) -> int | None:
        if not operand.flows:
            return None
        ranks = {self.ranks.get(flow.value) for flow in operand.flows}
        return ranks.pop() if len(ranks) == 1 else None

    def infer(
        self, kind: str, node: ast.AST, positional: list[Operand], tuples: dict[int, list]
    ) -> int | None:
        if kind == "torch.einsum" and positional and isinstance(positional[0].constant, str):
            spec = positional[0].constant.replace(" ", "")
            if "->" in spec and "..." not in spec:
                return len(spec.split("->", 1)[1])
            return None
        if kind in SHAPE_FROM_ARGUMENTS and isinstance(node, ast.Call):
            if any(isinstance(arg, ast.Starred) for arg in node.args) or node.keywords:
                return None
            shape = node.args[1:] if kind == "torch.reshape" else node.args
            if len(shape) == 1:
                single = shape[0]
                if isinstance(single, (ast.Tuple, ast.List)):
                    return len(single.elts)
                return None if kind != "Tensor.permute" else None
            return len(shape) or None
        if kind in THREE_D:
            return 3
        if kind == "matmul" and len(positional) == 2:
            # Batched matmul of two operands of rank >= 2 has the larger (broadcast) rank.
            ranks = [self.rank_of(op) for op in positional]
            if all(rank is not None and rank >= 2 for rank in ranks):
                return max(rank for rank in ranks if rank is not None)
            return None
        if kind == "getitem" and len(positional) == 1:
            return None
        if kind in RANK_OF_FIRST and positional:
            return self.rank_of(positional[0])
        if kind in RANK_PRESERVING:
            tensors = [op for op in positional if op.flows]
            ranks = [self.rank_of(op) for op in tensors]
            if not ranks or any(rank is None for rank in ranks):
                return None
            return max(rank for rank in ranks if rank is not None)
        return None

    def infer_getitem(self, base: Operand, index_node: ast.AST) -> int | None:
        rank = self.rank_of(base)
        if rank is None:
            return None
        items = index_node.elts if isinstance(index_node, ast.Tuple) else [index_node]
        for item in items:
            if isinstance(item, ast.Slice):
                continue
            if isinstance(item, ast.Constant) and item.value is None:
                rank += 1
            elif isinstance(item, ast.Constant) and isinstance(item.value, int):
                rank -= 1
            else:
                return None
        return rank
