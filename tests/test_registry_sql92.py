"""SQL92 selector compile check used by CHECK_CLIENT_CONFIG with enablePropertyFilter (engine.registry.sql92).

Cases mirror RocketMQ's filter/ParserTest plus the type checks of its expression factories."""
import pytest

from engine.registry.sql92 import FilterError, compile_filter, parse_sql92

VALID = [
    # ParserTest
    "a=3 and b<>4 And c>5 AND d<=4",
    "a=3  and    b<>4 And c>5 AND d<=4",
    "a=3 or b<>4 Or c>5 OR d<=4",
    "a in ('3', '4', '5')",
    "(a not in ('6', '4', '5')) or (b in ('3', '4', '5'))",
    "(a between 2 and 10) AND (b not between 6 and 9)",
    "a is null",
    "a is not null",
    "a <= now",
    "a=3 and b contains 'xxx' and c not contains 'xxx'",
    # more of the grammar
    "a startswith 'x' or b not startswith 'y' or c endswith 'z' or d not endswith 'w'",
    "a = 'it''s'",
    "a > -5 and b < +3 and c >= 1.5E3 and d <= .5 and e = 5L and f = 0",
    "NOT a", "not (a > 1)", "TRUE", "false", "NULL", "a",
    "a = TRUE", "5 = TRUE", "TRUE = FALSE", "a <> 'x'",
    "a not between 10 and 0",  # only BETWEEN checks the order of constant bounds
    "a between b and c",
    "/* comment */ a = 1 -- trailing comment\n",
    "$a_1 = 1 AND _b = 2",
    "a\t=\r\n1",
]

INVALID = [
    "a and between 2 and 10",  # ParserTest invalid
    " a between 10 and 0",  # ParserTest illegal between
    "a > 100000000000000000000000",  # decimal overflow
    "a > " + "1" * 400 + "." + "1" * 400 + "e400",  # float overflow
    "a > 0.0",  # Java: value < Double.MIN_VALUE
    "", "   ", "a +", "a >", "(a > 1", "a > 1)", "a == 1", "a ! b", "a > 1 -- no newline at the end",
    "a > 'x'", "'x' < a", "a > TRUE", "a > NULL", "a >= (b > 1)",  # only numbers compare with < > <= >=
    "a = NULL", "NULL = a", "TRUE = 5", "TRUE = 'x'",
    "a between NULL and 3", "a between 'x' and 'y'",
    "5 in ('x')", "a in (1)", "a in ()", "a in 'x'",
    "1", "'x'", "-a", "a and 5", "5 or a", "not 5", "a > 1 > 2",
    "a contains 5", "é = 1", "a = 1 2", "a is 1", "a not like 'x'",
    "/* unterminated", "a = 'unterminated",
]


@pytest.mark.parametrize("text", VALID)
def test_valid_selectors(text):
    parse_sql92(text)


@pytest.mark.parametrize("text", INVALID)
def test_invalid_selectors(text):
    with pytest.raises(FilterError) as e:
        parse_sql92(text)
    assert e.value.args[0].startswith("Invalid MessageSelector. ")


def test_compile_filter_types():
    compile_filter("SQL92", "a > 1")
    for t in ("XPATH", "sql92", "TAG"):
        with pytest.raises(FilterError) as e:
            compile_filter(t, "a > 1")
        assert e.value.args == (None,)  # Java: FilterFactory has no such filter, NullPointerException
    with pytest.raises(FilterError) as e:
        compile_filter("SQL92", None)
    assert e.value.args == (None,)


def test_error_says_where():
    with pytest.raises(FilterError, match="offset 4"):
        parse_sql92("a > ")
    with pytest.raises(FilterError, match="offset 2"):
        parse_sql92("a ! b")


# ---- budgets (issue 12 item 3): every failure is the typed error, never Python's own


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engine.codec.errors import RemotingError  # noqa: E402
from engine.registry.sql92 import MAX_DEPTH, MAX_EXPRESSION_LENGTH, FilterError, parse_sql92  # noqa: E402

_PIECES = st.sampled_from(["(", ")", "a", "b_1", "NOT", "AND", "OR", "=", "<>", ">", "<=", "'x'", "''", "1",
                           "1.5e3", "-", "+", "IS", "NULL", "BETWEEN", "IN", ",", "TRUE", "CONTAINS", " ", "/*",
                           "*/", "--", "\n", "99999999999999999999", "1e999", "$"])


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(_PIECES, max_size=60).map(" ".join)))
def test_any_text_is_accepted_or_a_typed_error(text):
    try:
        parse_sql92(text)
    except FilterError as e:
        assert isinstance(e, RemotingError) and isinstance(e, ValueError)
        assert len(str(e)) < 400


@pytest.mark.parametrize("text", ["(" * 100_000 + "a", "NOT " * 10_000 + "a", "-" * 5_000 + "1 > a",
                                  "a = " + "9" * 5_000, "a > " + "1" * 400 + ".5e999999",
                                  "a = 'x'" + " OR a = 'x'" * 20_000, "(" * (MAX_DEPTH + 1) + "a" + ")" * (MAX_DEPTH + 1)])
def test_deep_nesting_huge_literals_and_long_text_are_parse_failures(text):
    with pytest.raises(FilterError) as e:
        parse_sql92(text)
    assert len(str(e.value)) < 400


def test_nesting_within_the_budget_compiles():
    parse_sql92("(" * (MAX_DEPTH - 2) + "a = 1" + ")" * (MAX_DEPTH - 2))
    parse_sql92("a = 'x'" + " OR a = 'x'" * 100)
    assert MAX_EXPRESSION_LENGTH >= 64 * 1024
