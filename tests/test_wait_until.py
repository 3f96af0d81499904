"""The one polling helper the tests share: it returns what the predicate found, and fails
(never hangs) past its deadline, saying what it waited for and what it saw last."""
import itertools

import pytest

from conftest import wait_until


def test_returns_the_first_truthy_value():
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "ready", timeout=5) == "ready"


def test_fails_past_the_deadline_naming_what_and_the_last_value():
    with pytest.raises(AssertionError, match=r"the queue drained not reached within 0.1 s \(last value: \[\]\)"):
        wait_until(lambda: [], timeout=0.1, what="the queue drained")


def test_default_name_is_where_the_predicate_is_written():
    with pytest.raises(AssertionError, match=r"the condition at test_wait_until\.py:\d+ not reached"):
        wait_until(lambda: 0, timeout=0.05)
