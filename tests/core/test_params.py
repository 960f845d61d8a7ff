from dataclasses import dataclass, field
from typing import Literal

import pytest

from fedskew.core.errors import ConfigError
from fedskew.core.params import Options, build_params, check, minimums


@dataclass
class P:
    lr: float = 0.1
    steps: int = 3
    on: bool = True
    kind: Literal["a", "b"] = "a"
    clip: float | None = None
    layers: list[int] = field(default_factory=lambda: [1])

    def __post_init__(self) -> None:
        check(self.lr > 0, "lr", self.lr, "> 0")


def test_types_are_coerced_and_checked() -> None:
    p = build_params(P, {"lr": 1, "steps": 4.0, "clip": 2, "layers": [3, 4], "kind": "b"})
    assert p.lr == 1.0 and isinstance(p.lr, float)
    assert p.steps == 4 and isinstance(p.steps, int)
    assert p.clip == 2.0 and p.layers == [3, 4] and p.kind == "b"


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ({"nope": 1}, "unknown key 'algorithm.nope'; allowed: clip, kind, layers, lr, on, steps"),
        ({"steps": 1.5}, "algorithm.steps must be an integer, got 1.5"),
        ({"on": 1}, "algorithm.on must be true or false"),
        ({"kind": "c"}, "algorithm.kind must be one of 'a', 'b', got 'c'"),
        ({"lr": -1.0}, "algorithm.lr must be > 0, got -1.0"),
        ({"lr": "fast"}, "algorithm.lr must be a number"),
    ],
)
def test_bad_values_name_key_and_allowed(table: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        build_params(P, table, prefix="algorithm.")
    assert needle in str(e.value)


# ---- declared bounds (Options) -------------------------------------------------------------------

class _Base(Options):
    epochs: int = 1
    lr: float = 0.1
    at_least = minimums(epochs=1)
    positive = ("lr",)


class _Child(_Base):
    momentum: float = 0.0
    share: float = 1.0
    tags: list[str] = field(default_factory=list)
    at_least = minimums(momentum=0)
    fractions = ("momentum",)
    unit = ("share",)


@dataclass
class _Decorated(_Child):  # a plug-in written with the decorator still works
    extra: int = 2


def test_options_subclasses_are_dataclasses_with_merged_bounds() -> None:
    child = _Child(epochs=3, tags=["a"])
    assert (child.epochs, child.lr, child.tags) == (3, 0.1, ["a"])
    assert _Child().tags == [] and _Child().tags is not _Child().tags
    with pytest.raises(ConfigError, match=r"^epochs must be an integer >= 1, got 0$"):
        _Child(epochs=0)  # the parent's bound still holds
    with pytest.raises(ConfigError, match=r"^lr must be > 0, got 0.0$"):
        _Child(lr=0.0)
    with pytest.raises(ConfigError, match=r"^momentum must be in \[0, 1\), got 1.0$"):
        _Child(momentum=1.0)
    with pytest.raises(ConfigError, match=r"^share must be in \[0, 1\], got 1.5$"):
        _Child(share=1.5)
    assert _Child(share=1.0).share == 1.0


def test_an_explicit_dataclass_decorator_keeps_every_field_and_bound() -> None:
    d = _Decorated()
    assert (d.epochs, d.tags, d.extra) == (1, [], 2)
    with pytest.raises(ConfigError, match="epochs must be an integer >= 1"):
        _Decorated(epochs=0)
    built = build_params(_Decorated, {"extra": 5, "tags": ["x"]})
    assert (built.extra, built.tags) == (5, ["x"])


def test_algorithm_params_declare_their_bounds() -> None:
    from fedskew.algorithms import ALGORITHMS

    with pytest.raises(ConfigError, match=r"^algorithm\.mu must be >= 0, got -1\.0$"):
        build_params(ALGORITHMS.get("fedprox").Params, {"mu": -1.0}, prefix="algorithm.")
    with pytest.raises(ConfigError, match=r"^algorithm\.clients_per_round must be an integer >= 1, got 0$"):
        build_params(ALGORITHMS.get("fedrep").Params, {"clients_per_round": 0}, prefix="algorithm.")


class _KeywordsOnly(Options, kw_only=True):
    size: int = 1
    at_least = minimums(size=1)


class _Required(_KeywordsOnly):  # a field without a default after the parent's (keyword-only) defaults
    name: str


class _Frozen(Options, frozen=True):
    width: float = 1.0
    positive = ("width",)


def test_kw_only_and_frozen_are_class_keywords() -> None:
    import dataclasses
    import inspect

    assert _Required("a", size=2) == _Required(name="a", size=2)  # kw_only holds for the class's own fields only
    kinds = [p.kind.name for p in inspect.signature(_Required).parameters.values()]
    assert kinds == ["POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"]  # name, then the parent's size
    with pytest.raises(TypeError):
        _KeywordsOnly(2)  # type: ignore[misc]
    with pytest.raises(ConfigError, match=r"^size must be an integer >= 1, got 0$"):
        _Required(name="a", size=0)
    style = _Frozen()
    with pytest.raises(dataclasses.FrozenInstanceError):
        style.width = 2.0  # type: ignore[misc]
    assert hash(style) == hash(_Frozen()) and dataclasses.replace(style, width=3.0).width == 3.0
    with pytest.raises(ConfigError, match=r"^width must be > 0, got 0\.0$"):
        _Frozen(width=0.0)
