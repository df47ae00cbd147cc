"""Deterministic mutations of ``.spk`` sources: token-level and AST-level.

``.spk`` files use Python's token and expression syntax, so :mod:`tokenize` and :mod:`ast` give the
structure to mutate. Every mutation is drawn from a :class:`random.Random` the caller seeds, so a
mutant is reproduced from ``(source file, seed)`` alone (see :func:`mutant`).
"""

from __future__ import annotations

import ast
import io
import random
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("stdlib/kernels/*.spk"), *ROOT.glob("examples/*.spk")])
"""Every shipped ``.spk`` file."""

NUMBERS = ["0", "1", "-1", "2", "3", "6", "7", "16", "17", "64", "128", "1024", "65536", "2**31", "2**63",
           "-7", "0.5", "1e30", "True", "None", "(2, 1, 1)", "(2, 1, -7)", "(2**36, 1, 1)"]
NAMES = ["f16", "bf16", "f32", "i32", "u32", "e4m3", "ptr", "tensor", "constexpr", "load", "store", "arange",
         "program_id", "dot", "sum", "max", "where", "cdiv", "range", "static_assert", "undefined_name",
         "cluster", "tma", "mbarrier", "smem", "tmem", "warp_specialize", "num_warps", "float", "int"]
OPERATORS = ["+", "-", "*", "/", "//", "%", "<", ">", "<=", "==", "&", "|", "^", "<<", ">>", "**", ",", ":",
             "(", ")", "[", "]", "="]
OPTIONS = ["num_warps=6", "num_warps=0", "num_warps=64", "num_warps=3", "cluster=(2**63, 1, 1)",
           "cluster=(2, 1, -7)", "cluster=(2**36, 1, 1)", "cluster=(2, 1, 1)", "cluster=(4, 2, 1)",
           "num_stages=-1", "maxnreg=7", "num_ctas=2", "target=3"]


def _tokens(text: str) -> list[tokenize.TokenInfo]:
    try:
        return [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type in (tokenize.NAME, tokenize.NUMBER, tokenize.OP, tokenize.STRING)]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []


def _offsets(text: str) -> list[int]:
    starts, pos = [], 0
    for line in text.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    starts.append(pos)
    return starts


def token_mutation(rng: random.Random, text: str) -> tuple[str, str]:
    """Replace, delete, duplicate or swap one token."""
    toks = _tokens(text)
    if not toks:
        return text + "\n@kernel\n", "append a bare decorator"
    starts = _offsets(text)
    t = rng.choice(toks)
    a = starts[t.start[0] - 1] + t.start[1]
    b = starts[t.end[0] - 1] + t.end[1]
    kind = rng.choice(["replace", "replace", "delete", "duplicate", "swap"])
    if kind == "delete":
        return text[:a] + text[b:], f"delete {t.string!r} at {t.start}"
    if kind == "duplicate":
        return text[:b] + " " + t.string + text[b:], f"duplicate {t.string!r} at {t.start}"
    if kind == "swap":
        u = rng.choice(toks)
        c = starts[u.start[0] - 1] + u.start[1]
        d = starts[u.end[0] - 1] + u.end[1]
        if (a, b) > (c, d):
            a, b, c, d = c, d, a, b
        if b > c:
            return text, "no-op swap"
        return text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:], f"swap tokens at {t.start} and {u.start}"
    if t.type == tokenize.NUMBER:
        new = rng.choice(NUMBERS)
    elif t.type == tokenize.NAME:
        same_file = [x.string for x in toks if x.type == tokenize.NAME]
        new = rng.choice(NAMES) if rng.random() < 0.5 else rng.choice(same_file)
    elif t.type == tokenize.OP:
        new = rng.choice(OPERATORS)
    else:
        new = rng.choice(['""', '"x"', "1"])
    return text[:a] + new + text[b:], f"replace {t.string!r} at {t.start} by {new!r}"


class _AstMutator(ast.NodeTransformer):
    """Applies one mutation to the ``target``-th candidate node of its kind."""

    def __init__(self, rng: random.Random, kind: str, target: int):
        self.rng, self.kind, self.target, self.seen, self.done = rng, kind, target, 0, ""

    def _hit(self) -> bool:
        self.seen += 1
        return self.seen - 1 == self.target and not self.done

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if self.kind == "call" and self._hit():
            rng = self.rng
            choice = rng.choice(["drop", "dup", "swap", "kw", "clear"])
            if choice == "drop" and node.args:
                node.args.pop(rng.randrange(len(node.args)))
            elif choice == "dup" and node.args:
                node.args.append(rng.choice(node.args))
            elif choice == "swap" and len(node.args) > 1:
                i, j = rng.sample(range(len(node.args)), 2)
                node.args[i], node.args[j] = node.args[j], node.args[i]
            elif choice == "kw":
                node.keywords.append(ast.keyword(rng.choice(["mask", "other", "axis", "bogus", "multicast"]),
                                                 ast.parse(rng.choice(NUMBERS), mode="eval").body))
            else:
                node.keywords = []
            self.done = f"call mutation {choice} on line {node.lineno}"
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if self.kind == "binop" and self._hit():
            node.op = self.rng.choice([ast.Add(), ast.Sub(), ast.Mult(), ast.Div(), ast.FloorDiv(), ast.Mod(),
                                       ast.LShift(), ast.BitAnd(), ast.Pow()])
            self.done = f"operator changed on line {node.lineno}"
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        if self.kind == "subscript" and self._hit():
            new = self.rng.choice(["None, :", ":, None", "0", "f16", "f32, 3", "None"])
            node.slice = ast.parse(f"x[{new}]", mode="eval").body.slice  # type: ignore[attr-defined]
            self.done = f"subscript changed on line {node.lineno}"
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.generic_visit(node)
        if self.kind == "decorator" and node.decorator_list and self._hit():
            opt = ast.parse(f"f({self.rng.choice(OPTIONS)})", mode="eval").body.keywords[0]  # type: ignore[attr-defined]
            node.decorator_list = [ast.Call(ast.Name("kernel"), [], [opt])]
            self.done = f"decorator of {node.name} set to {ast.unparse(node.decorator_list[0])}"
        elif self.kind == "stmt" and len(node.body) > 1 and self._hit():
            i = self.rng.randrange(len(node.body))
            if self.rng.random() < 0.5:
                del node.body[i]
                self.done = f"statement {i} of {node.name} deleted"
            else:
                node.body.insert(i, node.body[self.rng.randrange(len(node.body))])
                self.done = f"statement of {node.name} duplicated at {i}"
        elif self.kind == "param" and node.args.args and self._hit():
            a = self.rng.choice(node.args.args)
            a.annotation = ast.parse(self.rng.choice(["ptr[f32]", "i32", "constexpr", "f16", "tensor[f16, 2]",
                                                      "ptr[i1]", "tensor[f32, 3]"]), mode="eval").body
            self.done = f"annotation of {a.arg} in {node.name} changed"
        return node


AST_KINDS = ["call", "call", "binop", "subscript", "decorator", "stmt", "stmt", "param"]


def ast_mutation(rng: random.Random, text: str) -> tuple[str, str]:
    """One structural mutation: call arguments, an operator, a subscript, a decorator's options,
    a statement deleted or duplicated, a parameter annotation."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return token_mutation(rng, text)
    kind = rng.choice(AST_KINDS)
    counter = _AstMutator(rng, kind, -1)
    counter.visit(ast.parse(text))
    if counter.seen == 0:
        return token_mutation(rng, text)
    m = _AstMutator(rng, kind, rng.randrange(counter.seen))
    tree = ast.fix_missing_locations(m.visit(tree))
    return ast.unparse(tree) + "\n", m.done or f"{kind}: nothing changed"


def mutant(path: Path, seed: int) -> tuple[str, str]:
    """The mutant of ``path`` for ``seed``: 1 to 3 mutations, token- or AST-level."""
    rng = random.Random(f"{path.name}:{seed}")
    text = path.read_text(encoding="utf-8")
    steps = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        text, what = (ast_mutation if rng.random() < 0.5 else token_mutation)(rng, text)
        steps.append(what)
    return text, "; ".join(steps)
