"""Model zoo: every model is a :class:`FedModel` (``features`` -> ``classifier``) built by name.

>>> model = create_model("cnn", in_channels=3, num_classes=10, image_size=32)
>>> count_parameters(model)
62006

Registered names: ``cnn``, ``fedavg_cnn``, ``cnn_cim`` (:mod:`.cnn`), ``convnet`` (:mod:`.convnet`),
``vgg11`` (:mod:`.vgg`), ``resnet18`` (:mod:`.resnet`), ``mlp`` and ``logreg`` (:mod:`.simple`).
"""

from fedskew.models import cnn, convnet, resnet, simple, vgg
from fedskew.models.registry import (
    MODELS,
    FedModel,
    ModelParams,
    count_parameters,
    create_model,
    model_options,
    norm_layer_types,
)

__all__ = [
    "MODELS",
    "FedModel",
    "ModelParams",
    "cnn",
    "convnet",
    "count_parameters",
    "create_model",
    "model_options",
    "norm_layer_types",
    "resnet",
    "simple",
    "vgg",
]
