"""Charts from the code interpreter (contract O11): the official `e2b-code-interpreter` SDK
reads the `chart` of a figure e2b-local's kernel shows, for every kind E2B's service
extracts (line with dates, categorical and log scales, scatter, bar, pie, box and whisker,
a superchart of several plots, and an unknown plot), with the SDK's own chart classes; and
an image a cell saves with PIL, shown as on E2B's template.

matplotlib and numpy are pinned beside the SDK in this venv (scripts/conformance), and the
server runs the kernels with this venv's python (`--kernel-python`), so cells import them.
The server runs with path mapping: the venv may live under the host's /tmp, which a mount
namespace replaces with the sandbox's own."""

import datetime
import sys

import pytest
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScatterChart,
    SuperChart,
)

from conftest import LocalServer, _use


@pytest.fixture(scope="module")
def sandbox():
    srv = LocalServer(extra_args=["--isolation", "path-mapping", "--kernel-python", sys.executable])
    mp = pytest.MonkeyPatch()
    _use(srv, mp)
    sbx = Sandbox.create(timeout=300)
    try:
        # The kernel is this venv's python: the pins are there, or this file proves nothing.
        probe = sbx.run_code("import matplotlib, numpy; matplotlib.__version__")
        assert probe.error is None and probe.text, probe
        yield sbx
    finally:
        Sandbox.kill(sbx.sandbox_id)
        mp.undo()
        srv.stop()


def chart_of(sandbox, code):
    execution = sandbox.run_code(code)
    assert execution.error is None, execution.error
    charts = [result.chart for result in execution.results if result.chart]
    assert len(charts) == 1, execution.results
    # The picture comes with it.
    assert execution.results[0].png
    return charts[0]


def test_a_line_chart_over_dates(sandbox):
    chart = chart_of(
        sandbox,
        """
import datetime
import matplotlib.pyplot as plt
import numpy as np
dates = [datetime.date(2023, 9, 1) + datetime.timedelta(days=i) for i in range(50)]
x = np.linspace(0, 2 * np.pi, 50)
plt.figure(figsize=(10, 6))
plt.plot(dates, np.sin(x), label="sin(x)")
plt.plot(dates, np.cos(x), label="cos(x)")
plt.xlabel("Time (s)")
plt.ylabel("Amplitude (Hz)")
plt.title("Plot of sin(x) and cos(x)")
plt.show()
""",
    )
    assert isinstance(chart, LineChart)
    assert chart.title == "Plot of sin(x) and cos(x)"
    assert (chart.x_label, chart.y_label, chart.x_unit, chart.y_unit) == (
        "Time (s)",
        "Amplitude (Hz)",
        "s",
        "Hz",
    )
    assert (chart.x_scale, chart.y_scale) == ("datetime", "linear")
    assert all(isinstance(t, str) for t in chart.x_ticks)
    datetime.datetime.fromisoformat(chart.x_ticks[0])
    assert all(isinstance(t, float) for t in chart.y_ticks)
    assert all(isinstance(t, str) for t in chart.y_tick_labels)
    assert [line.label for line in chart.elements] == ["sin(x)", "cos(x)"]
    first = chart.elements[0].points
    assert len(first) == 50
    assert datetime.datetime.fromisoformat(first[1][0]).date() == datetime.date(2023, 9, 2)
    assert first[0][1] == 0.0


def test_categorical_and_log_scales(sandbox):
    chart = chart_of(
        sandbox,
        """
import matplotlib.pyplot as plt
plt.plot([1, 2, 3, 4, 5], ["A", "B", "C", "D", "E"])
plt.show()
""",
    )
    assert (chart.x_scale, chart.y_scale) == ("linear", "categorical")
    assert chart.elements[0].points[:2] == [(1.0, "A"), (2.0, "B")]
    chart = chart_of(
        sandbox,
        """
import matplotlib.pyplot as plt
import numpy as np
x = np.linspace(0, 100, 100)
plt.plot(x, np.exp(x), label="y = e^x")
plt.yscale("log")
plt.xlabel("X-axis")
plt.ylabel("Y-axis (log scale)")
plt.grid(True)
plt.show()
""",
    )
    assert isinstance(chart, LineChart)
    assert (chart.x_scale, chart.y_scale, chart.y_unit) == ("linear", "log", "log scale")
    assert len(chart.elements) == 1 and len(chart.elements[0].points) == 100


def test_a_scatter_chart(sandbox):
    chart = chart_of(
        sandbox,
        """
import matplotlib.pyplot as plt
plt.xlabel("A")
plt.ylabel("B")
plt.scatter([0.1, 0.2, 0.3], [1, 2, 3], c="blue", label="Dataset 1")
plt.scatter([0.5] * 6, range(6), c="red", label="Dataset 2")
plt.show()
""",
    )
    assert isinstance(chart, ScatterChart)
    assert chart.title is None
    assert [(d.label, len(d.points)) for d in chart.elements] == [("Dataset 1", 3), ("Dataset 2", 6)]
    assert chart.elements[0].points[2] == (0.3, 3.0)


def test_bars_pies_and_boxes(sandbox):
    chart = chart_of(
        sandbox,
        """
import matplotlib.pyplot as plt
plt.bar(["Author A", "Author B", "Author C"], [100, 200, 300], label="Books Sold")
plt.xlabel("Authors")
plt.ylabel("Number of Books Sold")
plt.title("Book Sales by Authors")
plt.show()
""",
    )
    assert isinstance(chart, BarChart) and chart.type == ChartType.BAR
    assert [(b.label, b.group, b.value) for b in chart.elements] == [
        ("Author A", "Books Sold", 100),
        ("Author B", "Books Sold", 200),
        ("Author C", "Books Sold", 300),
    ]
    chart = chart_of(
        sandbox,
        """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.pie([90, 10], labels=["No", "No, in blue"], startangle=90)
plt.title("Will I wake up early tomorrow?")
plt.show()
""",
    )
    assert isinstance(chart, PieChart)
    assert [(w.label, w.angle, w.radius) for w in chart.elements] == [
        ("No", 324, 1),
        ("No, in blue", 36, 1),
    ]
    chart = chart_of(
        sandbox,
        """
import matplotlib.pyplot as plt
data = {"Class A": [85, 90, 78, 92, 88], "Class B": [95, 89, 76, 91, 84, 87], "Class C": [75, 82, 88, 79, 86]}
fig, ax = plt.subplots()
ax.set_title("Exam Scores Distribution")
ax.set_xlabel("Class")
ax.set_ylabel("Score")
ax.boxplot(data.values(), tick_labels=data.keys(), patch_artist=True)
plt.show()
""",
    )
    assert isinstance(chart, BoxAndWhiskerChart)
    boxes = chart.elements
    assert [b.label for b in boxes] == ["Class A", "Class B", "Class C"]
    assert [b.outliers for b in boxes] == [[], [76], []]
    assert [b.min for b in boxes] == [78, 84, 75]
    assert [b.first_quartile for b in boxes] == [85, 84.75, 79]
    assert [b.median for b in boxes] == [88, 88, 82]
    assert [b.third_quartile for b in boxes] == [90, 90.5, 86]
    assert [b.max for b in boxes] == [92, 95, 88]


def test_a_superchart_an_unknown_plot_and_a_blank_figure(sandbox):
    chart = chart_of(
        sandbox,
        """
import matplotlib.pyplot as plt
import numpy as np
fig, axs = plt.subplots(1, 2)
fig.suptitle("Multiple Charts Example")
axs[0].plot(np.linspace(0, 10, 100), np.sin(np.linspace(0, 10, 100)), "r")
axs[0].set_title("Sine Wave")
axs[1].scatter([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], label="Dataset 1")
axs[1].set_xlabel("X")
axs[1].set_title("Scatter Plot")
plt.show()
""",
    )
    assert isinstance(chart, SuperChart) and chart.title == "Multiple Charts Example"
    first, second = chart.elements
    assert isinstance(first, LineChart) and first.title == "Sine Wave"
    assert len(first.elements[0].points) == 100
    assert isinstance(second, ScatterChart) and second.x_label == "X"
    chart = chart_of(
        sandbox,
        """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, fill=False))
plt.title("Two Concentric Circles")
plt.show()
""",
    )
    assert chart.type == ChartType.UNKNOWN and chart.title == "Two Concentric Circles"
    assert chart.elements == []
    # A figure with nothing plotted is a picture without chart data.
    execution = sandbox.run_code("import matplotlib.pyplot as plt\nplt.figure()\nplt.show()")
    assert execution.error is None
    assert [r.chart for r in execution.results] == [None]
    assert execution.results[0].png


def test_an_image_a_cell_saves_is_shown_too(sandbox):
    # As E2B's template: PIL's `Image.save` to a path also displays the image.
    execution = sandbox.run_code(
        """
import numpy
from PIL import Image
image = Image.fromarray((numpy.random.rand(16, 16, 3) * 255).astype("uint8")).convert("RGBA")
image.save("saved.png")
print("Image saved.")
"""
    )
    assert execution.error is None, execution.error
    assert [bool(r.png) for r in execution.results] == [True]
    assert execution.logs.stdout == ["Image saved.\n"]
    assert sandbox.run_code("import os; os.path.getsize('saved.png') > 0").text == "True"
