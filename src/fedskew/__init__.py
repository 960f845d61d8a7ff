"""fedskew: federated learning on skewed (non-IID) client data."""

__version__ = "0.1.0"
