# Chart data of a matplotlib figure, as E2B's code interpreter gives it in a result's
# "e2b/chart" (the SDKs' `Result.chart`): what kind of chart each plot is, its title, axis
# labels, units, scales and ticks, and its elements (lines' and scatters' points, bars,
# pie wedges, box-and-whisker statistics). A figure with several plots is a "superchart" of
# one chart per plot. Prepended to the kernel program; matplotlib is imported only by the
# figures that need it, so a sandbox without it loses nothing.
import re as _chart_re

_UNIT = _chart_re.compile(r"\s\(([^)]*)\)|\[([^\]]*)\]")


def _chart_text(value):
    return value if value else None


def _chart_unit(label):
    """The unit a label names in parentheses after a space, or in brackets: `Time (s)`."""
    if not label:
        return None
    found = _UNIT.search(label)
    if not found:
        return None
    return found.group(1) if found.group(1) is not None else found.group(2)


def _chart_number(value):
    number = float(value)
    # Whole numbers and values computed in binary come back as the number they mean.
    rounded = round(number, 10)
    return rounded


def _chart_artists(ax):
    """The plot's own artists, in the order they were added, without its texts."""
    from matplotlib.text import Text

    children = getattr(ax, "_children", None)
    if children is None:
        children = list(ax.lines) + list(ax.collections) + list(ax.patches)
    return [child for child in children if not isinstance(child, Text)]


def _chart_kind(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge

    artists = _chart_artists(ax)
    if all(isinstance(a, Line2D) for a in artists):
        return "line"
    if all(isinstance(a, (PathPatch, Line2D)) for a in artists):
        return "box_and_whisker"
    # A line across the whole plot (`axhline`, `axvline`) is a guide, not data.
    artists = [a for a in artists if not (isinstance(a, Line2D) and _chart_is_guide(a))]
    if all(isinstance(a, PathCollection) for a in artists):
        return "scatter"
    if all(isinstance(a, Wedge) for a in artists):
        return "pie"
    if all(isinstance(a, Rectangle) for a in artists):
        return "bar"
    return "unknown"


def _chart_is_guide(line):
    transform = line.get_transform()
    # axhline and axvline draw in axes coordinates along one direction.
    return not transform.contains_branch(line.axes.transData) and len(line.get_xdata()) == 2


def _chart_scale(axis):
    """`linear`, `log`, ... as matplotlib names the scale; `datetime` or `categorical` for
    an axis of dates or of names."""
    import matplotlib.category
    import matplotlib.dates

    scale = axis.get_scale()
    if scale != "linear":
        return scale
    converter = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
    if isinstance(converter, matplotlib.category.StrCategoryConverter):
        return "categorical"
    date_formatters = (
        matplotlib.dates.DateFormatter,
        matplotlib.dates.AutoDateFormatter,
        matplotlib.dates.ConciseDateFormatter,
    )
    if "Date" in type(converter).__name__ or isinstance(axis.get_major_formatter(), date_formatters):
        return "datetime"
    return "linear"


def _chart_value(axis, scale, value):
    """A data value as the axis shows it: an ISO date, a category's name, or a number."""
    if scale == "datetime":
        import matplotlib.dates

        return matplotlib.dates.num2date(float(value)).isoformat()
    if scale == "categorical":
        names = {position: name for name, position in axis.units._mapping.items()}
        return str(names.get(round(float(value)), value))
    return _chart_number(value)


def _chart_2d(ax, kind):
    x_label = _chart_text(ax.get_xlabel())
    y_label = _chart_text(ax.get_ylabel())
    return {
        "type": kind,
        "title": _chart_text(ax.get_title()),
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": _chart_unit(x_label),
        "y_unit": _chart_unit(y_label),
        "elements": [],
    }


def _chart_points(ax, kind):
    chart = _chart_2d(ax, kind)
    for side, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        scale = _chart_scale(axis)
        chart[side + "_scale"] = scale
        chart[side + "_ticks"] = [_chart_value(axis, scale, t) for t in axis.get_ticklocs()]
        chart[side + "_tick_labels"] = [t.get_text() for t in axis.get_ticklabels()]
    x_scale, y_scale = chart["x_scale"], chart["y_scale"]

    def point(x, y):
        return (_chart_value(ax.xaxis, x_scale, x), _chart_value(ax.yaxis, y_scale, y))

    if kind == "line":
        for line in _chart_artists(ax):
            points = [point(x, y) for x, y in line.get_xydata()]
            chart["elements"].append({"label": line.get_label(), "points": points})
    else:
        for collection in _chart_artists(ax):
            if not hasattr(collection, "get_offsets"):
                continue
            points = [point(x, y) for x, y in collection.get_offsets()]
            chart["elements"].append({"label": collection.get_label(), "points": points})
    return chart


def _chart_tick_name(axis, position):
    """The tick label shown nearest to `position` on `axis`."""
    best = None
    for location, label in zip(axis.get_ticklocs(), axis.get_ticklabels()):
        distance = abs(float(location) - position)
        if best is None or distance < best[0]:
            best = (distance, label.get_text())
    return best[1] if best else ""


def _chart_bars(ax):
    from matplotlib.container import BarContainer

    chart = _chart_2d(ax, "bar")
    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    horizontal = any(getattr(c, "orientation", "vertical") == "horizontal" for c in containers)
    groups = [(c.get_label(), list(c.patches)) for c in containers]
    if not groups:
        groups = [("", [p for p in _chart_artists(ax)])]
    for group, patches in groups:
        for patch in patches:
            if horizontal:
                value = patch.get_width()
                name = _chart_tick_name(ax.yaxis, patch.get_y() + patch.get_height() / 2)
            else:
                value = patch.get_height()
                name = _chart_tick_name(ax.xaxis, patch.get_x() + patch.get_width() / 2)
            chart["elements"].append(
                {"label": name, "group": group or "", "value": _chart_number(value)}
            )
    if horizontal:
        chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
        chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]
    return chart


def _chart_pie(ax):
    chart = {"type": "pie", "title": _chart_text(ax.get_title()), "elements": []}
    for wedge in _chart_artists(ax):
        chart["elements"].append(
            {
                "label": wedge.get_label(),
                "angle": _chart_number(abs(wedge.theta2 - wedge.theta1)),
                "radius": _chart_number(wedge.r),
            }
        )
    return chart


def _chart_boxes(ax):
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch

    chart = _chart_2d(ax, "box_and_whisker")
    artists = _chart_artists(ax)
    boxes = [a for a in artists if isinstance(a, PathPatch)]
    lines = [a for a in artists if isinstance(a, Line2D)]
    extents = [box.get_path().get_extents() for box in boxes]
    # Each box has two whiskers along its values, and a median and two caps across them:
    # more horizontal strokes than vertical ones means the boxes stand upright.
    vertical = horizontal = 0
    for line in lines:
        xs, ys = list(line.get_xdata()), list(line.get_ydata())
        if len(xs) != 2 or line.get_linestyle() in ("None", "", " "):
            continue
        if xs[0] == xs[1] and ys[0] != ys[1]:
            vertical += 1
        elif ys[0] == ys[1] and xs[0] != xs[1]:
            horizontal += 1
    upright = horizontal >= vertical
    for box, extent in zip(boxes, extents):
        if upright:
            low, high = extent.x0, extent.x1
            q1, q3 = extent.y0, extent.y1
        else:
            low, high = extent.y0, extent.y1
            q1, q3 = extent.x0, extent.x1
        center = (low + high) / 2
        width = high - low
        along, across = [], []
        for line in lines:
            xs, ys = list(line.get_xdata()), list(line.get_ydata())
            position, values = (xs, ys) if upright else (ys, xs)
            if not position or not all(low - 1e-9 <= float(p) <= high + 1e-9 for p in position):
                continue
            across.append((line, [float(v) for v in values], [float(p) for p in position]))
        markers = [line for line, v, p in across if line.get_linestyle() in ("None", "", " ")]
        drawn = [(v, p) for line, v, p in across if line not in markers]
        whiskers = [v for v, p in drawn if len(v) == 2 and v[0] != v[1]]
        outliers = [v for line, values, p in across if line in markers for v in values]
        flat = [(v[0], max(p) - min(p)) for v, p in drawn if len(v) == 2 and v[0] == v[1]]
        medians = [value for value, span in flat if span >= 0.9 * width and q1 <= value <= q3]
        ends = [v for pair in whiskers for v in pair]
        chart["elements"].append(
            {
                "label": _chart_tick_name(ax.xaxis if upright else ax.yaxis, center),
                "min": _chart_number(min(ends) if ends else q1),
                "first_quartile": _chart_number(q1),
                "median": _chart_number(medians[0] if medians else (q1 + q3) / 2),
                "third_quartile": _chart_number(q3),
                "max": _chart_number(max(ends) if ends else q3),
                "outliers": [_chart_number(v) for v in outliers],
            }
        )
    if not upright:
        chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
        chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]
    return chart


def _chart_of_axes(ax):
    kind = _chart_kind(ax)
    if kind in ("line", "scatter"):
        return _chart_points(ax, kind)
    if kind == "bar":
        return _chart_bars(ax)
    if kind == "pie":
        return _chart_pie(ax)
    if kind == "box_and_whisker":
        return _chart_boxes(ax)
    return {"type": "unknown", "title": _chart_text(ax.get_title()), "elements": []}


def chart_of(figure):
    """The chart data of `figure`, or None for a figure with nothing plotted."""
    axes = figure.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    # Tick labels are decided when the figure is drawn.
    figure.canvas.draw()
    if len(axes) > 1:
        if hasattr(figure, "get_suptitle"):
            title = figure.get_suptitle()
        else:
            suptitle = getattr(figure, "_suptitle", None)
            title = suptitle.get_text() if suptitle is not None else None
        return {
            "type": "superchart",
            "title": _chart_text(title),
            "elements": [_chart_of_axes(ax) for ax in axes],
        }
    return _chart_of_axes(axes[0])
