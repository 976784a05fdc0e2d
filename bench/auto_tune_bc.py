#!/usr/bin/env python3
"""`bc -l` as vLLM's auto_tune.sh uses it, for a machine without bc: each input line is one
comparison (printed 1 or 0) or one sum of the script's own numbers. A line that is not a
number expression (a benchmark that printed no number) prints 0, false, as bc's error would
leave the script's test false."""

import ast
import operator
import sys

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv, ast.Lt: operator.lt, ast.LtE: operator.le,
       ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq}


def value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](value(node.left), value(node.right))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in OPS:
        return int(OPS[type(node.ops[0])](value(node.left), value(node.comparators[0])))
    raise ValueError(ast.dump(node))


def bc(line: str) -> str:
    try:
        v = value(ast.parse(line.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return "0"
    return f"{round(v, 10):g}"


if __name__ == "__main__":
    for line in sys.stdin:
        print(bc(line))
