"""ProfileResult: the statistics that say how far to trust it, its wire form, its text, HTML
and plot."""
import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelrpc.runtime import ProfileResult
from kernelrpc.runtime.conditions import FIELDS
from kernelrpc.runtime.profile import FORMAT_VERSION

CLEAN = {"wall_s": 0.5, "cpus": [0, 1], "own_cpu_s": 0.5, "other_cpu_s": 0.01,
         "other_load": 0.01, "preempted": 2, "freq_mhz": [2400.0, 2400.0],
         "threads": [{"tid": 10, "cpu": 0, "cpu_s": 0.25}, {"tid": 11, "cpu": 1, "cpu_s": 0.25}],
         "clock_tick_s": 0.01}


def conditions(**changes):
    data = copy.deepcopy(CLEAN)
    data.update(changes)
    return data


def test_cv_and_outliers():
    result = ProfileResult([1e-3, 1.01e-3, 0.99e-3, 1.0e-3, 1.02e-3, 5e-3], number=3)
    assert result.cv == pytest.approx(result.std / result.mean)
    assert result.outliers == [5]
    assert ProfileResult([2e-6] * 5, number=1).outliers == []
    assert ProfileResult([2e-6] * 5, number=1).cv == 0
    # fewer than 4 repeats: no verdict on outliers
    assert ProfileResult([1e-3, 1e-3, 9e-3], number=1).outliers == []


def test_units_follow_the_magnitude():
    assert "median 12.34 µs" in repr(ProfileResult([12.34e-6], number=100))
    assert "median 850.0 ns" in repr(ProfileResult([850e-9], number=100))
    assert "median 2.500 s" in repr(ProfileResult([2.5], number=1))
    text = str(ProfileResult([12.34e-6, 12.5e-6], number=100, function="addone"))
    assert "median (µs)" in text and "12.42" in text and "0.0000" not in text


def test_gflops_when_the_caller_gives_the_flop_count():
    result = ProfileResult([1e-3], number=1)
    assert result.gflops is None and "GFLOP/s" not in repr(result)
    result.flops = 2 * 512 ** 3
    assert result.gflops == pytest.approx(2 * 512 ** 3 / 1e-3 / 1e9)
    assert "268.4 GFLOP/s" in repr(result) and "GFLOP/s" in str(result)
    assert ProfileResult.from_dict(json.loads(json.dumps(result.to_dict()))).gflops == result.gflops


def test_clean_conditions_are_not_disturbed():
    result = ProfileResult([1e-3] * 5, number=1, conditions=conditions())
    assert not result.disturbed and result.disturbance() == []
    assert "DISTURBED" not in repr(result) and "DISTURBED" not in str(result)
    assert "device: CPUs 0-1, other processes 1.0%" in str(result)
    assert "2 threads ran (last on CPU 0-1)" in str(result) and "2400-2400 MHz" in str(result)


def test_other_processes_beyond_the_threshold_disturb():
    busy = conditions(other_cpu_s=0.4, other_load=0.4)
    result = ProfileResult([1e-3] * 5, number=1, conditions=busy)
    assert result.disturbed
    (reason,) = result.disturbance()
    assert "other processes used 40.0% of CPUs 0-1" in reason
    assert "DISTURBED: other processes used 40.0%" in repr(result)
    assert "re-measure" in str(result) and "re-measure" in result._repr_html_()
    # a higher threshold accepts it; within a clock tick per CPU is below the resolution
    assert result.disturbance(load=0.5) == []
    short = conditions(wall_s=0.005, other_cpu_s=0.02, other_load=2.0)
    assert not ProfileResult([1e-3], number=1, conditions=short).disturbed


def test_a_changing_clock_disturbs():
    result = ProfileResult([1e-3], number=1, conditions=conditions(freq_mhz=[1200.0, 3000.0]))
    assert result.disturbance() == ["the CPU frequency varied from 1200 to 3000 MHz"]
    assert not ProfileResult([1e-3], number=1, conditions=conditions(freq_mhz=None)).disturbed


def test_wire_form_round_trip_and_version_1_dicts():
    result = ProfileResult([3e-3, 1e-3], number=5, target={"string": "llvm"}, function="gemm",
                           conditions=conditions(), flops=1e6)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["version"] == FORMAT_VERSION == 2
    assert ProfileResult.from_dict(data) == result
    old = {"results": [1e-3], "number": 1, "repeat": 1, "target": {}, "function": "f"}
    loaded = ProfileResult.from_dict(old)
    assert loaded.conditions is None and not loaded.disturbed
    assert "device conditions not reported" in repr(loaded)
    # later versions may add fields; readers ignore them
    assert ProfileResult.from_dict({**data, "version": 3, "extra": [1]}) == result


@pytest.mark.parametrize("change, message", [
    ({"conditions": "busy"}, "'conditions' must be a dict"),
    ({"conditions": {"cpus": [0]}}, "need 'wall_s'"),
    ({"conditions": conditions(wall_s=float("inf"))}, "'wall_s' must be a finite number"),
    ({"conditions": conditions(other_cpu_s=-1.0)}, "'other_cpu_s' must be a finite number"),
    ({"conditions": conditions(cpus=[])}, "'cpus' must be a non-empty list"),
    ({"conditions": conditions(cpus=list(range(5000)))}, "'cpus' must be a non-empty list"),
    ({"conditions": conditions(preempted=1.5)}, "'preempted' must be an integer"),
    ({"conditions": conditions(freq_mhz=[1.0])}, "'freq_mhz' must be"),
    ({"conditions": conditions(threads=[{"tid": "x", "cpu": 0, "cpu_s": 0}])}, "'threads' entries"),
    ({"conditions": conditions(threads=[{}] * 5000)}, "at most 4096 threads"),
    ({"flops": "many"}, "'flops' must be a number"),
])
def test_untrusted_conditions_are_refused(change, message):
    data = {"results": [1e-3], "number": 1, **change}
    with pytest.raises(ValueError, match=message):
        ProfileResult.from_dict(data)


def test_html_escapes_and_shows_the_table():
    result = ProfileResult([1e-6, 2e-6, 1.5e-6], number=10, function="<script>",
                           conditions=conditions())
    markup = result._repr_html_()
    assert "<table>" in markup and "<th>median (µs)</th>" in markup
    assert "<script>" not in markup and "&lt;script&gt;" in markup


def test_plot_shows_every_repeat():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = ProfileResult([1e-3, 1.01e-3, 0.99e-3, 1.0e-3, 5e-3], number=3, function="gemm",
                           conditions=conditions(other_cpu_s=0.4, other_load=0.4))
    ax = result.plot()
    (points,) = ax.collections
    assert [y for _, y in points.get_offsets()] == pytest.approx([1.0, 1.01, 0.99, 1.0, 5.0])
    colors = points.get_facecolors()
    assert tuple(colors[4]) != tuple(colors[0])  # the outlier stands out
    assert ax.get_ylabel() == "time per call (ms)" and "DISTURBED" in ax.get_title()
    plt.close(ax.figure)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=16)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([*FIELDS, "tid", "cpu"]), _JSON, max_size=10),
       st.sampled_from([None, [0], [0, 1]]), st.sampled_from([None, 0.5]))
def test_any_conditions_from_the_network_load_or_give_a_valueerror(data, cpus, wall):
    cond = dict(data)
    if cpus is not None:
        cond["cpus"] = cpus
    if wall is not None:
        cond["wall_s"] = wall
    try:
        result = ProfileResult.from_dict({"results": [1e-3], "number": 1, "conditions": cond})
    except ValueError:
        return
    repr(result), str(result), result._repr_html_(), result.disturbed  # all of it renders
