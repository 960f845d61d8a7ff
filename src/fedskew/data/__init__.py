"""Datasets (sources, cache) and partitioners into client shards."""

from fedskew.data.sources import DATASETS, ArrayDataset, load_dataset, resolve_data_dir

__all__ = ["DATASETS", "ArrayDataset", "load_dataset", "resolve_data_dir"]
