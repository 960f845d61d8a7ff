"""The ServerApp and ClientApp of an app folder, after its plug-ins are imported (its ``fedskew_app.py`` calls
:func:`server` and :func:`client`).

Flower imports the app's ``fedskew_app`` module in the ServerApp's process and in every SuperNode's
ClientApp process, from the app bundle's folder, so the plug-in files packed there are imported on every
machine before a request names what they register. This module imports neither PyTorch nor the rest of fedskew:
each side loads them when it first has work, so a ClientApp process that only answers a step of SecAgg+'s key
exchange (Flower starts one per request) starts in about a second rather than the several PyTorch takes (unless
the app's plug-ins import it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedskew.engine.flower.mods import make_client_app
from fedskew.plugins import load_plugins


def server(app_file: str, plugins: Sequence[str]) -> ServerApp:
    """Import ``plugins`` (files relative to the folder of ``app_file``, or module names); return fedskew's
    ServerApp (:func:`.server_app.main`), which runs the experiment with these plug-ins in place of its own
    ``plugins``."""
    packed = load_plugins(plugins, base=Path(app_file).resolve().parent)
    app = ServerApp()

    @app.main()
    def run(grid: Grid, context: Context) -> None:
        from fedskew.engine.flower.server_app import main

        main(grid, context, packed)

    return app


def client(app_file: str, plugins: Sequence[str]) -> ClientApp:
    """Import ``plugins`` (as :func:`server` does); return fedskew's ClientApp (:func:`.client_app.handle`)."""
    load_plugins(plugins, base=Path(app_file).resolve().parent)

    def handle(message: Message, context: Context) -> Message:
        from fedskew.engine.flower.client_app import handle as run_task

        return run_task(message, context)

    return make_client_app(handle)
