"""kernelrpc.display: units for the magnitude, tables as text and HTML, when progress shows."""
import io

import pytest

from kernelrpc import display
from kernelrpc.runtime import ProfileResult


@pytest.mark.parametrize("seconds, text", [
    (2.5, "2.500 s"), (0.0123, "12.30 ms"), (1.234e-5, "12.34 µs"), (8.5e-7, "850.0 ns"),
    (3e-10, "0.3000 ns"), (0.0, "0 ns"), (999.96e-6, "1.000 ms"), (float("nan"), "-"),
    (1234.5, "1234 s"),
])
def test_format_time_picks_the_unit_for_the_magnitude(seconds, text):
    assert display.format_time(seconds) == text


def test_format_time_in_a_given_unit_and_rates():
    assert display.format_time(2e-3, display.time_unit(1e-6)) == "2000 µs"
    assert display.format_rate(2 * 1024 ** 3, 0.01) == "214.7 GFLOP/s"
    assert display.format_rate(1e9, 0) == "-"
    assert display.format_percent(0.0123) == "1.2%" and display.format_percent(None) == "-"


def test_table_text_and_html():
    table = display.Table(["name", "value"], [["a<b>", 1.23456], ["c", None]], title="T & U",
                          notes=["careful"])
    assert str(table).splitlines() == ["T & U", "name  value", "----  -----", "a<b>  1.235",
                                       "   c      -", "careful"]
    markup = table._repr_html_()
    assert "<b>T &amp; U</b>" in markup and "a&lt;b&gt;" in markup and "careful" in markup
    assert markup.count("<tr>") == 3


def test_compare_one_row_per_result():
    results = {"slow": ProfileResult([2e-3, 2.1e-3], number=1),
               "fast": ProfileResult([20e-6, 21e-6], number=10,
                                     conditions={"wall_s": 1.0, "cpus": [0], "other_cpu_s": 0.5,
                                                 "other_load": 0.5, "clock_tick_s": 0.01})}
    table = display.compare(results, flops=2e6, title="sweep")
    assert table.header == ["", "median", "min", "max", "cv", "outliers", "GFLOP/s", "device"]
    assert table.rows[0][:2] == ["slow", "2.050 ms"] and table.rows[0][-1] == "not reported"
    assert table.rows[1][:2] == ["fast", "20.50 µs"] and table.rows[1][-1] == "disturbed"
    assert table.rows[1][6] == "97.56"


def test_progress_shows_only_where_someone_watches(monkeypatch):
    monkeypatch.delenv(display.PROGRESS_ENV, raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal
    assert not display.progress_enabled()
    assert isinstance(display.progress(10, "x"), display._NoProgress)
    assert display.progress_enabled(True) and not display.progress_enabled(False)
    monkeypatch.setenv(display.PROGRESS_ENV, "1")
    assert display.progress_enabled()
    monkeypatch.setenv(display.PROGRESS_ENV, "0")
    assert not display.progress_enabled()
    assert not display.in_notebook()


def test_progress_bar_writes_to_stderr_when_enabled(monkeypatch):
    pytest.importorskip("tqdm")
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with display.byte_progress(4 << 20, "upload x", enabled=True) as bar:
        bar.update(4 << 20)
    assert "upload x" in err.getvalue() and "4.00M" in err.getvalue()
    off = display.progress(5, "y", enabled=False)
    off.update(2)
    off.set_postfix_str("ignored")
    off.close()
    assert off.n == 2 and "y" not in err.getvalue()
