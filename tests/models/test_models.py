"""Tests of the model registry: the FedModel contract for every registered model, and paper sizes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fedskew.core.errors import ConfigError
from fedskew.models import MODELS, FedModel, count_parameters, create_model, model_options, norm_layer_types
from fedskew.models.registry import ModelParams

torch.set_num_threads(1)

BATCH = 3
SIZES = (8, 28, 32)
NAMES = MODELS.names()
SHAPE_CASES = [
    (name, size, channels)
    for name in NAMES
    for size in ((*SIZES, 64) if name == "convnet" else SIZES)
    for channels in (1, 3)
]


def build(name: str, channels: int = 3, size: int = 32, classes: int = 10, **options: Any) -> FedModel:
    return create_model(name, in_channels=channels, num_classes=classes, image_size=size, **options)


def images(channels: int = 3, size: int = 32) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=torch.Generator().manual_seed(0))


def test_expected_models_are_registered() -> None:
    expected = {"cnn", "fedavg_cnn", "cnn_cim", "convnet", "vgg11", "resnet18", "mlp", "logreg"}
    assert expected <= set(NAMES)


@pytest.mark.parametrize(("name", "size", "channels"), SHAPE_CASES)
def test_forward_is_classifier_of_features(name: str, size: int, channels: int) -> None:
    torch.manual_seed(0)
    model = build(name, channels, size, classes=7).eval()
    x = images(channels, size)
    with torch.no_grad():
        logits = model(x)
        embedding = model.features(x)
        assert logits.shape == (BATCH, 7)
        assert embedding.shape == (BATCH, model.embed_dim)
        assert isinstance(model.classifier, nn.Linear)
        assert model.classifier.in_features == model.embed_dim
        torch.testing.assert_close(model.classifier(embedding), logits, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_parameter(name: str) -> None:
    torch.manual_seed(0)
    model = build(name).train()
    loss = nn.functional.cross_entropy(model(images()), torch.tensor([0, 1, 2]))
    loss.backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None, pname
        assert torch.isfinite(param.grad).all(), pname
        assert param.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", NAMES)
def test_init_is_deterministic_under_manual_seed(name: str) -> None:
    states = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        states.append(build(name, size=8).state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


@pytest.mark.parametrize("name", NAMES)
def test_functional_call_matches_forward(name: str) -> None:
    model = build(name, size=8).eval()
    x = images(size=8)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():
        torch.testing.assert_close(torch.func.functional_call(model, tensors, (x,)), model(x))


@pytest.mark.parametrize("name", NAMES)
def test_channels_last_matches_contiguous(name: str) -> None:
    model = build(name).eval()
    x = images()
    with torch.no_grad():
        expected = model(x)
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        actual = model(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_is_rejected_with_the_allowed_ones(name: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown key 'model.no_such_option' for model '{name}'") as info:
        build(name, no_such_option=1)
    for option in model_options(name):
        assert option in str(info.value)


def test_unknown_model_lists_the_registered_names() -> None:
    with pytest.raises(ConfigError, match="'no_such_model'") as info:
        build("no_such_model")
    for name in NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("key", ["in_channels", "num_classes", "image_size"])
@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_bad_dimensions_are_rejected(key: str, value: object) -> None:
    dims: dict[str, object] = {"in_channels": 3, "num_classes": 10, "image_size": 32, key: value}
    with pytest.raises(ConfigError, match=key):
        create_model("logreg", **dims)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("convnet", {"net_norm": "bogus"}),
        ("convnet", {"net_pooling": "bogus"}),
        ("convnet", {"net_act": "bogus"}),
        ("convnet", {"net_width": 0}),
        ("convnet", {"net_width": 6, "net_norm": "groupnorm"}),
        ("convnet", {"net_depth": 4}),  # 8 -> 4 -> 2 -> 1 -> 0
        ("vgg11", {"norm": "instancenorm"}),
        ("vgg11", {"norm": "groupnorm", "num_groups": 3}),
        ("resnet18", {"norm": "none"}),
        ("resnet18", {"stem": "bogus"}),
        ("mlp", {"hidden": [200, 0]}),
        ("mlp", {"hidden": "200"}),
        ("fedavg_cnn", {"padding": 0}),  # 8x8 needs padding
        ("cnn", {"padding": -1}),
    ],
)
def test_bad_option_values_are_rejected(name: str, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        build(name, size=8, **options)


# --- sizes fixed by the papers -------------------------------------------------------------------


def test_cnn_size() -> None:
    # conv1 3*6*25+6 = 456, conv2 6*16*25+16 = 2,416, fc1 400*120+120 = 48,120, fc2 120*84+84 = 10,164,
    # fc3 84*10+10 = 850 -> 62,006.
    model = build("cnn")
    assert count_parameters(model) == 62_006
    assert model.embed_dim == 84
    assert any(isinstance(m, nn.Linear) and m.in_features == 16 * 5 * 5 for m in model.modules())
    # On MNIST: fc1 256*120+120 -> 44,426, the MNIST CNN size HFLDD reports.
    assert count_parameters(build("cnn", channels=1, size=28)) == 44_426


def test_fedavg_cnn_size() -> None:
    # conv1 32*25+32 = 832, conv2 64*32*25+64 = 51,264, fc1 1024*512+512 = 524,800, fc2 5,130.
    model = build("fedavg_cnn", channels=1, size=28)
    assert count_parameters(model) == 582_026
    assert any(isinstance(m, nn.Linear) and m.in_features == 1024 for m in model.modules())
    # "same" convolutions: fc1 3136*512+512 -> 1,663,370, the count McMahan et al. report.
    assert count_parameters(build("fedavg_cnn", channels=1, size=28, padding=2)) == 1_663_370


def test_cnn_cim_size() -> None:
    # conv1 3*64*25+64 = 4,864, conv2 64*128*25+128 = 204,928, fc1 3200*384+384 = 1,229,184,
    # fc2 384*192+192 = 73,920, fc3 192*10+10 = 1,930 -> 1,514,826.
    assert count_parameters(build("cnn_cim")) == 1_514_826


def test_convnet_sizes() -> None:
    # conv 3*128*9+128 = 3,584, 2 x conv 128*128*9+128 = 147,584, 3 x GroupNorm 256, fc 2048*10+10.
    model = build("convnet")
    assert count_parameters(model) == 320_010
    assert model.embed_dim == 128 * 4 * 4
    assert sum(isinstance(m, nn.GroupNorm) and m.num_groups == 128 for m in model.modules()) == 3
    # 64x64 (DomainNet): fc 8192*10+10 -> 381,450, the ConvNet size FedAF reports.
    assert count_parameters(build("convnet", size=64)) == 381_450
    # 28x28: the first conv pads by 3 as in the DC code, 28 -> 32 -> 16 -> 8 -> 4.
    assert build("convnet", channels=1, size=28).embed_dim == 128 * 4 * 4


@pytest.mark.parametrize("net_norm", ["instancenorm", "batchnorm", "layernorm", "groupnorm", "none"])
@pytest.mark.parametrize("net_pooling", ["avgpooling", "maxpooling", "none"])
def test_convnet_variants_run(net_norm: str, net_pooling: str) -> None:
    model = build("convnet", size=8, net_norm=net_norm, net_pooling=net_pooling, net_width=8)
    assert model(images(size=8)).shape == (BATCH, 10)
    expected_side = 1 if net_pooling != "none" else 8
    assert model.embed_dim == 8 * expected_side**2


def test_vgg11_size() -> None:
    model = build("vgg11")
    assert count_parameters(model) == 9_231_114
    assert model.classifier.in_features == 512
    assert count_parameters(build("vgg11", norm="none")) == 9_231_114 - 2 * 2752


def test_resnet18_sizes() -> None:
    assert count_parameters(build("resnet18")) == 11_173_962
    assert count_parameters(build("resnet18", stem="imagenet")) == 11_181_642  # FedAF's appendix
    gn = build("resnet18", norm="groupnorm")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gn.modules())
    assert gn(images()).shape == (BATCH, 10)


def test_simple_model_sizes() -> None:
    assert count_parameters(build("mlp", channels=1, size=28)) == 199_210  # FedAvg's 2NN
    assert count_parameters(build("logreg", channels=1, size=28)) == 7_850
    assert build("logreg", channels=1, size=28).embed_dim == 784
    assert build("mlp", channels=1, size=8, hidden=[16]).embed_dim == 16


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("vgg11", {}),
        ("vgg11", {"norm": "groupnorm"}),
        ("resnet18", {}),
        ("resnet18", {"norm": "groupnorm"}),
        *[
            ("convnet", {"net_norm": norm})
            for norm in ("instancenorm", "batchnorm", "layernorm", "groupnorm")
        ],
    ],
)
def test_norm_layer_types_cover_the_norm_layers(name: str, options: dict[str, Any]) -> None:
    norms = [m for m in build(name, size=8, **options).modules() if "Norm" in type(m).__name__]
    assert norms
    assert all(isinstance(m, norm_layer_types) for m in norms)


def test_model_options_reports_defaults() -> None:
    assert model_options("convnet") == {
        "net_width": 128,
        "net_depth": 3,
        "net_norm": "instancenorm",
        "net_act": "relu",
        "net_pooling": "avgpooling",
    }
    assert model_options("logreg") == {}


def test_every_model_declares_its_options() -> None:
    for name in NAMES:
        params = MODELS.params_of(name)
        assert params is not None and issubclass(params, ModelParams), name
        assert list(model_options(name)) == MODELS.keys(name)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("convnet", {"net_norm": "bogus"}, r"model\.net_norm must be one of instancenorm, batchnorm, .*got 'bogus'"),
        ("convnet", {"net_width": 6, "net_norm": "groupnorm"}, r"model\.net_width must be divisible by 4"),
        ("vgg11", {"norm": "instancenorm"}, r"model\.norm must be one of batchnorm, groupnorm, none, got"),
        ("resnet18", {"norm": "none"}, r"model\.norm must be one of batchnorm, groupnorm, got 'none'"),
        ("resnet18", {"num_groups": 0}, r"model\.num_groups must be an integer >= 1, got 0"),
        ("mlp", {"hidden": [200, 0]}, r"model\.hidden must be a list of positive integers, got \[200, 0\]"),
        ("mlp", {"hidden": "200"}, r"model\.hidden must be a list, got '200'"),
        ("cnn", {"padding": -1}, r"model\.padding must be an integer >= 0, got -1"),
        ("logreg", {"hidden": [3]}, r"unknown key 'model\.hidden' for model 'logreg'; allowed: $"),
    ],
)
def test_a_model_table_validates_in_one_call(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MODELS.build_params(name, {"name": name, **options}, "model.")
    defaults = MODELS.params_of(name)
    assert defaults is not None and MODELS.build_params(name, {"name": name}, "model.") == defaults()
