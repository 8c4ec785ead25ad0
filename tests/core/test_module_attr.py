"""A `MODULE:ATTR` flag naming the wrong kind of thing says what it found and what to create:
a class where an instance is wanted, a function, a module, or another kind."""

import functools
import re

import pytest

from specstrat._module_attr import not_a
from specstrat.cli import main

CLASS_POLICY = "specstrat.strategies:FixedSpeculationPolicy"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["bench", "--algo", "NGRAM", "--adaptive", CLASS_POLICY],
            r"--adaptive 'specstrat\.strategies:FixedSpeculationPolicy' is a class "
            r"\(FixedSpeculationPolicy\), not an instance of it: a SpeculationPolicy .* instance "
            r"is wanted; create one in specstrat\.strategies \(FIXEDSPECULATIONPOLICY = "
            r"FixedSpeculationPolicy\(\.\.\.\)\) and pass --adaptive "
            r"specstrat\.strategies:FIXEDSPECULATIONPOLICY",
        ),
        (
            ["demo", "--adaptive", CLASS_POLICY],
            r"--adaptive '.*:FixedSpeculationPolicy' is a class \(FixedSpeculationPolicy\), not "
            r"an instance of it",
        ),
        (
            ["bench", "--algo", "specstrat:SpecAlgorithm"],
            r"--algo 'specstrat:SpecAlgorithm' is a class \(SpecAlgorithm\), not an instance of it",
        ),
        (
            ["bench", "--algo", "specstrat:register"],
            r"--algo 'specstrat:register' is a function \(register\), not a SpecAlgorithm; call "
            r"it in specstrat \(RESULT = register\(\.\.\.\)\) and pass --algo specstrat:RESULT",
        ),
        (
            ["bench", "--algo", "specstrat:strategies"],
            r"--algo 'specstrat:strategies' is a module \(specstrat\.strategies\), not a "
            r"SpecAlgorithm; name an attribute of it: --algo specstrat\.strategies:NAME",
        ),
    ],
    ids=["bench-adaptive-class", "demo-adaptive-class", "algo-class", "algo-function", "module"],
)
def test_bench_and_demo_say_what_they_found(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench and demo exit 2 with one stderr line saying what the attribute is and the fix."""
    assert main([*argv, "--requests", "1", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert re.search(message, err), err


def test_demo_algo_class_and_check_class_are_named() -> None:
    """demo --algo and check with a class exit naming it as a class, not an instance."""
    with pytest.raises(SystemExit, match=r"specstrat demo: --algo 'specstrat:SpecAlgorithm' is a "):
        main(["demo", "--algo", "specstrat:SpecAlgorithm", "--requests", "1"])
    with pytest.raises(
        SystemExit,
        match=r"specstrat check: 'specstrat:SpecAlgorithm' is a class \(SpecAlgorithm\), not an "
        r"instance of it: a SpecAlgorithm instance is wanted; create one in specstrat "
        r"\(SPECALGORITHM = SpecAlgorithm\(\.\.\.\)\) and pass specstrat:SPECALGORITHM",
    ):
        main(["check", "specstrat:SpecAlgorithm"])


def test_an_upper_case_class_name_gets_a_distinct_suggestion() -> None:
    """A class already named in upper case is told to create MY_<NAME>, not itself again."""
    class_named_upper = type("ALGO", (), {})
    assert "(MY_ALGO = ALGO(...)) and pass --algo m:MY_ALGO" in not_a(
        "--algo", "m:ALGO", class_named_upper, "SpecAlgorithm"
    )


def test_a_class_of_another_kind_is_not_told_to_instantiate_itself() -> None:
    """A class whose instances are not the wanted kind (a policy class for --algo, an algorithm
    class for --adaptive) is named as such, with no suggestion to create one of it."""
    from specstrat import SpecAlgorithm
    from specstrat.protocols import SpeculationPolicy
    from specstrat.strategies import FixedSpeculationPolicy

    policy = not_a("--algo", "m:Fixed", FixedSpeculationPolicy, "SpecAlgorithm", SpecAlgorithm)
    assert re.search(
        r"--algo 'm:Fixed' is a class \(FixedSpeculationPolicy\), and its instances are not a "
        r"SpecAlgorithm either; pass a SpecAlgorithm instance",
        policy,
    )
    assert "FixedSpeculationPolicy(...)" not in policy
    algo = not_a("--adaptive", "m:Algo", SpecAlgorithm, "SpeculationPolicy", SpeculationPolicy)
    assert "its instances are not a SpeculationPolicy either" in algo


def test_a_callable_object_is_not_called_a_function() -> None:
    """A callable instance is named by its type; a partial is a function named after what it
    wraps; the article agrees with the noun ("an int")."""

    class Maker:
        def __call__(self) -> None: ...

    assert re.search(
        r"'m:MAKE' is a callable Maker instance, not a SpecAlgorithm; if calling it returns "
        r"one, call it in m \(RESULT = MAKE\(\.\.\.\)\)",
        not_a("--algo", "m:MAKE", Maker(), "SpecAlgorithm"),
    )
    partial = functools.partial(sorted, [])
    assert "is a function (sorted), not a SpecAlgorithm" in not_a(
        "", "m:P", partial, "SpecAlgorithm"
    )
    assert not_a("", "m:N", 3, "SpecAlgorithm").endswith("is an int, not a SpecAlgorithm")
