"""One look for every figure fedskew draws: the report's, ``fedskew partition``'s and ``fedskew condense``'s.

:class:`FigureStyle` holds what a paper needs to set (figure width and height, font size, titles on or off, a
single- or double-column preset); :meth:`FigureStyle.context` applies it, with TrueType fonts embedded in PDF
and PostScript files (``pdf.fonttype = 42``: submission checks refuse the default Type 3 fonts), while a
figure is drawn and saved. :data:`DATASET_TITLES` and :func:`setting_title` name the dataset and partition in
titles as a paper would (``Fashion-MNIST, Dirichlet α=0.1, 100 clients``), without the config's internal keys.

Only this module's :meth:`FigureStyle.context` imports matplotlib, so reading a style costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import Any, Literal

from fedskew.core.errors import FedskewError
from fedskew.core.params import Options, check

FORMATS = ("png", "pdf", "svg")
"""Figure formats of the report (``fedskew report --format``)."""
DEFAULT_DPI = 150
"""Resolution of raster figures (PNG, and the PNG copy the report page shows of a PDF figure)."""
DEFAULT_FONT_SIZE = 10.0
"""Points; matplotlib's own default."""
PRESETS: dict[str, tuple[float, float]] = {"single": (3.3, 8.0), "double": (6.9, 9.0)}
"""Paper presets: (figure width in inches, font size in points) of a figure one column wide in a two-column
paper (``single``, about 3.3 in) and of one spanning both columns (``double``, about 6.9 in)."""
LINE_WIDTH = 1.6
"""Points; every series of a figure is drawn this wide (none thinner because it was plotted later)."""
MARKER_SIZE = 5.0
"""Points; every series' markers are this big."""

DATASET_TITLES = {
    "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "cifar10_jpeg": "CIFAR-10 (JPEG)", "digits": "digits",
    "domainnet": "DomainNet", "fashion_mnist": "Fashion-MNIST", "mnist": "MNIST", "tiny_imagenet": "Tiny ImageNet",
    "synthetic": "synthetic data",
}
"""How figure titles name the built-in datasets (others, plug-ins' among them, by their registered name)."""

PARTITION_TITLES = {
    "iid": "IID", "dirichlet": "Dirichlet", "shards": "shards", "quantity": "quantity skew",
    "classes_per_client": "classes per client", "noise": "feature noise", "domain": "one domain per client",
    "mixed": "mixed",
}
"""How figure titles name the built-in partitioners."""
PARTITION_OPTIONS = {"alpha": "α", "sigma": "σ", "shards_per_client": "shards/client", "classes": "#C"}
"""The partition options a title shows, and how (the others, such as ``min_size`` and ``max_retries``, are
how the partition is drawn, not what it is)."""


def dataset_title(name: object) -> str:
    """A dataset's name as figure titles give it (:data:`DATASET_TITLES`)."""
    return DATASET_TITLES.get(str(name), str(name))


def partition_title(name: object, num_clients: int | None, options: Mapping[str, Any]) -> str:
    """A partition as figure titles give it: ``Dirichlet α=0.1, 10 clients`` (of its ``options``, only those that
    say what it is: :data:`PARTITION_OPTIONS`)."""
    shown = ", ".join(f"{PARTITION_OPTIONS[k]}={v}" for k, v in options.items()
                      if k in PARTITION_OPTIONS and v is not None)
    text = PARTITION_TITLES.get(str(name), str(name)) + (f" {shown}" if shown else "")
    if num_clients is not None:
        text += f", {num_clients} clients"
    return text


class FigureStyle(Options, frozen=True):
    """How the figures look: the ``[report]`` config table, ``fedskew report``'s options and
    ``fedskew.report(..., style=...)``.

    Attributes
    ----------
    width, height
        Figure size in inches; None: each figure's own (7 x 4.5 for the curves), or the preset's width. Only
        a width: the height follows the figure's own aspect ratio.
    font_size
        Base font size in points (tick labels, legends and titles are set relative to it); None: 10, or the
        preset's.
    titles
        False: no titles (a paper's caption says what a figure shows).
    preset
        ``"single"`` (one column of a two-column paper: 3.3 in wide, 8 pt) or ``"double"`` (both columns:
        6.9 in, 9 pt); ``width`` and ``font_size`` given as well win over it. Empty: no preset.
    format, dpi
        The report's file format (``png``, ``pdf`` or ``svg``) and the resolution of raster figures.
    """

    width: float | None = None
    height: float | None = None
    font_size: float | None = None
    titles: bool = True
    preset: Literal["", "single", "double"] = ""
    format: Literal["png", "pdf", "svg"] = "png"
    dpi: int = DEFAULT_DPI

    def __post_init__(self) -> None:
        super().__post_init__()
        # Numbers only (a style is also built in Python, where no table's types were checked), in a range that
        # names its unit: no declared bound says both.
        for key in ("width", "height"):
            value = getattr(self, key)
            check(value is None or (_real(value) and 0.5 <= value <= 50), key, value, "inches in [0.5, 50]")
        size = self.font_size
        check(size is None or (_real(size) and 4 <= size <= 40), "font_size", size, "points in [4, 40]")
        check(self.preset in ("", *PRESETS), "preset", self.preset, f"one of {', '.join(PRESETS)} (or empty)")
        check(isinstance(self.titles, bool), "titles", self.titles, "true or false")
        check_format(self.format, self.dpi)

    def updated(self, **changes: Any) -> FigureStyle:
        """This style with the ``changes`` that are not None."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def as_table(self) -> dict[str, Any]:
        """The non-default settings, as a ``[report]`` table holds them."""
        default = FigureStyle()
        return {k: v for k, v in asdict(self).items() if v != getattr(default, k)}

    @property
    def font(self) -> float:
        """The base font size in points."""
        if self.font_size is not None:
            return float(self.font_size)
        return PRESETS[self.preset][1] if self.preset else DEFAULT_FONT_SIZE

    def size(self, width: float, height: float) -> tuple[float, float]:
        """The size of a figure whose own size is ``width`` x ``height`` inches, in this style."""
        w = self.width if self.width is not None else (PRESETS[self.preset][0] if self.preset else None)
        if w is None:
            return (width, height) if self.height is None else (width, float(self.height))
        return float(w), float(self.height) if self.height is not None else height * w / width

    def title(self, text: str) -> str:
        """``text``, or nothing without titles."""
        return text if self.titles else ""

    def rc(self) -> dict[str, Any]:
        """The matplotlib settings of this style."""
        return {
            "pdf.fonttype": 42,  # TrueType, embedded: no Type 3 fonts, which submission checks refuse
            "ps.fonttype": 42,
            "svg.fonttype": "path",
            "font.size": self.font,
            "lines.linewidth": LINE_WIDTH,
            "lines.markersize": MARKER_SIZE,
            "savefig.dpi": self.dpi,
            "figure.dpi": 100,
            "axes.titlesize": "medium",
            "image.cmap": "viridis",
        }

    @contextmanager
    def context(self) -> Iterator[None]:
        """Draw and save figures in this style: every figure built and saved inside it."""
        import matplotlib

        settings: Any = self.rc()  # matplotlib's stubs name every key as a Literal
        with matplotlib.rc_context(settings):
            yield


def check_format(fmt: str, dpi: int) -> None:
    """Refuse a figure format other than :data:`FORMATS` and a resolution outside [50, 1200] dpi."""
    if fmt not in FORMATS:
        raise FedskewError(f"figure format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not 50 <= dpi <= 1200:
        raise FedskewError(f"dpi must be an integer in [50, 1200], got {dpi!r}")


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


DEFAULT_STYLE = FigureStyle()


def style_of(report_tables: Iterable[Mapping[str, Any]]) -> FigureStyle:
    """The style of the ``[report]`` table that runs share (``report_tables``: each run's as its ``config.toml``
    records it, where it is not the default: :meth:`~fedskew.runs.RunData.recorded_table`); the default where
    they differ or have none."""
    from fedskew.core.params import build_params

    tables = [dict(table) for table in report_tables]
    shared = tables[0] if tables and all(t == tables[0] for t in tables) else {}
    return build_params(FigureStyle, shared, prefix="report.") if shared else DEFAULT_STYLE
