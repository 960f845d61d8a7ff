"""The ServerApp and ClientApp of an app folder, after its plug-ins are imported (its ``fedskew_app.py`` calls
:func:`server` and :func:`client`).

Flower imports the app's ``fedskew_app`` module in the ServerApp's process and in every SuperNode's
ClientApp process, from the app bundle's folder, so the plug-in files packed there are imported on every
machine before a request names what they register.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from fedskew.engine.flower.client_app import app as client_app
from fedskew.engine.flower.server_app import server_app
from fedskew.plugins import load_plugins


def server(app_file: str, plugins: Sequence[str]) -> ServerApp:
    """Import ``plugins`` (files relative to the folder of ``app_file``, or module names); return fedskew's
    ServerApp, which runs the experiment with these plug-ins in place of its own ``plugins``."""
    return server_app(load_plugins(plugins, base=Path(app_file).resolve().parent))


def client(app_file: str, plugins: Sequence[str]) -> ClientApp:
    """Import ``plugins`` (as :func:`server` does); return fedskew's ClientApp."""
    load_plugins(plugins, base=Path(app_file).resolve().parent)
    return client_app
