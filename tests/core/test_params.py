from dataclasses import dataclass, field
from typing import Literal

import pytest

from fedskew.core.errors import ConfigError
from fedskew.core.params import build_params, check


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
