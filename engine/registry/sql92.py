"""Compile-check of RocketMQ SQL92 message selectors, for CHECK_CLIENT_CONFIG (PROTOCOL.md 6.5).

With ``enablePropertyFilter`` on, the broker compiles a non-TAG subscription with ``FilterFactory`` and answers
SUBSCRIPTION_PARSE_FAILED when that fails. This module accepts exactly the language of RocketMQ's
``filter/.../parser/SelectorParser.jj`` (tokens, precedence, ``IS [NOT] NULL``, ``[NOT] BETWEEN``, ``[NOT] IN``,
``[NOT] CONTAINS / STARTSWITH / ENDSWITH``, comments) and applies the checks its expression factories make while
building the tree:

* the whole selector, and each side of AND / OR / NOT, must be boolean or a bare property;
* ``>``, ``>=``, ``<``, ``<=`` (and BETWEEN, which is built from them) take no string, boolean or NULL constant and
  no boolean expression;
* ``=`` / ``<>`` take no NULL constant, and a TRUE/FALSE constant only against another boolean constant when both
  sides are constants;
* BETWEEN with two constant bounds needs them non-null and in order; IN needs a property on its left;
* integer literals must fit a Java long; float literals must be finite and not round to zero (Java's check
  ``value < Double.MIN_VALUE`` rejects ``0.0``).

Only the verdict matches Java; the error texts are ours (Java's are JavaCC messages wrapped in a Java exception).
Evaluation against message properties is not implemented: a broker without a message store never filters.
"""
from __future__ import annotations

import re

from engine.codec.errors import RemotingError, clip

__all__ = ["FilterError", "compile_filter", "parse_sql92"]

#: budgets for a client's expression: its length, and how deep parentheses / NOT / sign chains may nest (Java's
#: recursive-descent parser has only its thread stack; here a deep nest is a parse failure, not a RecursionError)
MAX_EXPRESSION_LENGTH = 64 * 1024
MAX_DEPTH = 100
#: longest part of the expression a message quotes
MAX_QUOTE = 64


class FilterError(RemotingError, ValueError):
    """The expression does not compile; ``str(e)`` is the remark of the SUBSCRIPTION_PARSE_FAILED answer."""


# Expression kinds of the tree SelectorParser builds (only what the checks need)
_NUM, _STR, _BOOL_CONST, _NULL, _PROP, _BOOL, _NEG = "number", "string", "boolean", "NULL", "property", "bool", "neg"
_CONST = (_NUM, _STR, _BOOL_CONST, _NULL)

_KEYWORDS = {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH",
             "ENDSWITH"}
# (kind, regex) in declaration order: the longest match wins, ties go to the earlier one (JavaCC)
_TOKENS = [
    ("SKIP", re.compile(r"[ \t\n\r\f]+")),
    ("SKIP", re.compile(r"--[^\n\r]*(?:\n|\r\n?)")),
    ("SKIP", re.compile(r"/\*[^*]*\*+(?:[^*/][^*]*\*+)*/")),
    ("WORD", re.compile(r"(?i:NOT|AND|OR|BETWEEN|IN|TRUE|FALSE|NULL|IS|CONTAINS|STARTSWITH|ENDSWITH)")),
    ("DECIMAL", re.compile(r"(?:0|[1-9][0-9]*)[lL]?")),
    ("FLOAT", re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+")),
    ("STRING", re.compile(r"'(?:''|[^'])*'")),
    ("ID", re.compile(r"[a-zA-Z_$][a-zA-Z0-9_$]*")),
    ("OP", re.compile(r"<>|>=|<=|[=><(),+-]")),
]


def _tokenize(text: str) -> list:
    out = []
    pos, n = 0, len(text)
    while pos < n:
        best = None
        for kind, rx in _TOKENS:
            m = rx.match(text, pos)
            if m and (best is None or m.end() > best[1].end()):
                best = (kind, m)
        if best is None:
            raise FilterError(f"Invalid MessageSelector. Lexical error at offset {pos}: {text[pos:pos + 16]!r}")
        kind, m = best
        if kind != "SKIP":
            value = m.group()
            if kind in ("WORD", "ID") and value.upper() in _KEYWORDS:
                kind, value = "KW", value.upper()
            out.append((kind, value, pos))
        pos = m.end()
    out.append(("EOF", "", n))
    return out


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0

    def nest(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FilterError(f"Invalid MessageSelector. Nested deeper than {MAX_DEPTH} at offset {self.peek()[2]}")

    # ------------------------------------------------------------------------------------------ token helpers
    def peek(self, k: int = 0):
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def at(self, value: str, k: int = 0) -> bool:
        kind, v, _ = self.peek(k)
        return kind in ("KW", "OP") and v == value

    def take(self, value: str) -> bool:
        if self.at(value):
            self.i += 1
            return True
        return False

    def expect(self, value: str) -> None:
        if not self.take(value):
            self.fail(f"expected {value!r}")

    def fail(self, what: str):
        kind, v, pos = self.peek()
        found = "end of input" if kind == "EOF" else repr(clip(v, MAX_QUOTE))
        raise FilterError(f"Invalid MessageSelector. {what}, found {found} at offset {pos}")

    # ------------------------------------------------------------------------------------------ checks
    @staticmethod
    def boolean(e):
        if e[0] in (_BOOL, _BOOL_CONST, _NULL, _PROP):
            return e
        raise FilterError("Invalid MessageSelector. Expression will not result in a boolean value: "
                          f"{clip(e[1], MAX_QUOTE)}")

    @staticmethod
    def less_than_operand(e):
        if e[0] in _CONST and e[0] != _NUM or e[0] == _BOOL:
            raise FilterError(f"Invalid MessageSelector. Value '{clip(e[1], MAX_QUOTE)}' cannot be compared.")

    @staticmethod
    def equal_operands(left, right):
        for e in (left, right):
            if e[0] == _NULL:
                raise FilterError(f"Invalid MessageSelector. '{clip(e[1], MAX_QUOTE)}' cannot be compared.")
        if left[0] in _CONST and right[0] in _CONST and left[0] == _BOOL_CONST and right[0] != _BOOL_CONST:
            raise FilterError(f"Invalid MessageSelector. '{clip(left[1], MAX_QUOTE)}' cannot be compared with "
                              f"'{clip(right[1], MAX_QUOTE)}'")

    # ------------------------------------------------------------------------------------------ grammar
    def selector(self):
        e = self.boolean(self.or_expr())
        if self.peek()[0] != "EOF":
            self.fail("unexpected token")
        return e

    def or_expr(self):
        left = self.and_expr()
        while self.take("OR"):
            right = self.and_expr()
            left = (_BOOL, f"({self.boolean(left)[1]} OR {self.boolean(right)[1]})")
        return left

    def and_expr(self):
        left = self.equality()
        while self.take("AND"):
            right = self.equality()
            left = (_BOOL, f"({self.boolean(left)[1]} AND {self.boolean(right)[1]})")
        return left

    def equality(self):
        left = self.comparison()
        while True:
            if self.take("="):
                right = self.comparison()
                self.equal_operands(left, right)
                left = (_BOOL, f"{left[1]} = {right[1]}")
            elif self.take("<>"):
                right = self.comparison()
                self.equal_operands(left, right)
                left = (_BOOL, f"{left[1]} <> {right[1]}")
            elif self.at("IS") and self.at("NULL", 1):
                self.i += 2
                left = (_BOOL, f"{left[1]} IS NULL")
            elif self.at("IS"):
                self.i += 1
                self.expect("NOT")
                self.expect("NULL")
                left = (_BOOL, f"{left[1]} IS NOT NULL")
            else:
                return left

    def string_literal(self) -> str:
        kind, v, _ = self.peek()
        if kind != "STRING":
            self.fail("expected a string literal")
        self.i += 1
        return v[1:-1].replace("''", "'")

    def in_list(self) -> None:
        self.expect("(")
        self.string_literal()
        while self.take(","):
            self.string_literal()
        self.expect(")")

    def comparison(self):
        left = self.unary()
        while True:
            op = self.peek()[1] if self.peek()[0] == "OP" else None
            negated = self.at("NOT") and self.peek(1)[0] == "KW" and self.peek(1)[1] in (
                "CONTAINS", "STARTSWITH", "ENDSWITH", "BETWEEN", "IN")
            if op in (">", ">=", "<", "<="):
                self.i += 1
                right = self.unary()
                self.less_than_operand(left)
                self.less_than_operand(right)
                left = (_BOOL, f"{left[1]} {op} {right[1]}")
                continue
            if negated:
                self.i += 1
            kw = self.peek()[1] if self.peek()[0] == "KW" else None
            if kw in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
                self.i += 1
                self.string_literal()
                left = (_BOOL, f"{left[1]} {kw}")
            elif kw == "BETWEEN":
                self.i += 1
                low = self.unary()
                self.expect("AND")
                high = self.unary()
                if not negated and low[0] in _CONST and high[0] in _CONST:
                    if low[0] == _NULL or high[0] == _NULL:
                        raise FilterError("Invalid MessageSelector. Illegal values of between, values can not be null!")
                    if low[0] == high[0] and low[2] is not None and high[2] < low[2]:
                        raise FilterError("Invalid MessageSelector. Illegal values of between, left value("
                                          f"{clip(low[1], MAX_QUOTE)}) must less than or equal to right value("
                                          f"{clip(high[1], MAX_QUOTE)})")
                for e in (left, low, high):
                    self.less_than_operand(e)
                left = (_BOOL, f"{left[1]} BETWEEN {low[1]} AND {high[1]}")
            elif kw == "IN":
                self.i += 1
                self.in_list()
                if left[0] != _PROP:
                    raise FilterError("Invalid MessageSelector. Expected a property for In expression, got: "
                                      f"{clip(left[1], MAX_QUOTE)}")
                left = (_BOOL, f"{left[1]} IN (...)")
            else:
                return left

    def unary(self):
        self.nest()
        try:
            if self.take("+"):
                return self.unary()
            if self.take("-"):
                e = self.unary()
                return (_NEG, f"-{clip(e[1], MAX_QUOTE)}")
            if self.take("NOT"):
                e = self.boolean(self.unary())
                return (_BOOL, f"NOT {clip(e[1], MAX_QUOTE)}")
            return self.primary()
        finally:
            self.depth -= 1

    def primary(self):
        kind, v, _ = self.peek()
        if kind == "STRING":
            s = self.string_literal()
            return (_STR, f"'{s}'", s)
        if kind == "DECIMAL":
            self.i += 1
            digits = v.rstrip("lL")
            # a Java long has at most 19 digits; longer text is out of range before any conversion (Python's int()
            # refuses more than 4,300 digits with a ValueError of its own)
            n = int(digits) if len(digits) <= 19 else None
            if n is None or not -(1 << 63) <= n < (1 << 63):
                raise FilterError(f"Invalid MessageSelector. For input string: \"{clip(digits, MAX_QUOTE)}\"")
            return (_NUM, v, n)
        if kind == "FLOAT":
            self.i += 1
            x = float(v)
            if x == float("inf"):
                raise FilterError(f"Invalid MessageSelector. {clip(v, MAX_QUOTE)} is greater than "
                                  "1.7976931348623157E308")
            if x < 4.9e-324:
                raise FilterError(f"Invalid MessageSelector. {clip(v, MAX_QUOTE)} is less than 4.9E-324")
            return (_NUM, v, x)
        if kind == "KW" and v in ("TRUE", "FALSE"):
            self.i += 1
            return (_BOOL_CONST, v, v == "TRUE")
        if kind == "KW" and v == "NULL":
            self.i += 1
            return (_NULL, v, None)
        if kind == "ID":
            self.i += 1
            return (_PROP, v, None)
        if self.take("("):
            e = self.or_expr()
            self.expect(")")
            return e
        self.fail("expected a literal, a property or '('")


def parse_sql92(text: str) -> None:
    """Raise FilterError unless ``text`` compiles as RocketMQ's SelectorParser would compile it."""
    if text is None:
        raise FilterError(None)  # Java: NullPointerException, remark null
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise FilterError(f"Invalid MessageSelector. The expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    _Parser(text).selector()


def compile_filter(expression_type: str, text: str) -> None:
    """FilterFactory.INSTANCE.get(type).compile(text): only SQL92 is registered; other types fail (Java: NPE)."""
    if expression_type != "SQL92":
        raise FilterError(None)
    parse_sql92(text)
