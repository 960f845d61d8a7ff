"""Dataset sources: parse the official files of each dataset into plain ``uint8`` arrays.

Every dataset becomes the same thing, an :class:`ArrayDataset` of NCHW ``uint8`` images and
``int64`` labels, so partitioners, models and algorithms never care where the data came from.
Loaders are registered by name in :data:`DATASETS`, each with a Params dataclass declaring its
options, and called through :func:`load_dataset`.

Loaders read the official release formats (IDX files, the CIFAR python pickles, image-folder
trees and archives) from the data dir; they download only when asked (``download=True``) and
check official checksums where they are published. Every problem with the files becomes a
one-line :class:`~fedskew.core.errors.DataError` naming the file, never a traceback. Decoded
arrays are cached on disk (see :mod:`fedskew.data.cache`), so only the first load is slow.

:mod:`.container` holds :class:`ArrayDataset`; :mod:`.base` the registry, the shared Params and
:func:`load_dataset`; :mod:`.checks` the option checks; :mod:`.archive` reads folders and archives.
Then one module per family: :mod:`.small` (digits, synthetic), :mod:`.idx` (mnist, fashion_mnist),
:mod:`.cifar` (cifar10, cifar100), :mod:`.images` (image decoding, image_folder, cifar10_jpeg),
:mod:`.domains` (domain_folder, domainnet), :mod:`.tiny_imagenet` and :mod:`.huggingface` (Hugging Face
``datasets``, an optional extra imported only when used); importing this package registers them all.
"""

from fedskew.data.sources import cifar, domains, huggingface, idx, images, small, tiny_imagenet
from fedskew.data.sources.base import DATASETS, DatasetParams, load_dataset, resolve_data_dir
from fedskew.data.sources.cifar import CIFAR10_CLASSES
from fedskew.data.sources.container import ArrayDataset, channel_stats
from fedskew.data.sources.domains import DOMAINNET_DOMAINS
from fedskew.data.sources.idx import parse_idx, read_idx

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "DOMAINNET_DOMAINS",
    "ArrayDataset",
    "DatasetParams",
    "channel_stats",
    "cifar",
    "domains",
    "huggingface",
    "idx",
    "images",
    "load_dataset",
    "parse_idx",
    "read_idx",
    "resolve_data_dir",
    "small",
    "tiny_imagenet",
]
