"""How fedskew's ClientApp is put together: its handlers, and the mod that runs secure aggregation on its ``train``
handler. Light on purpose (Flower only), for :mod:`.components` and :mod:`.client_app` alike."""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS


def is_secure(message: Message) -> bool:
    """Whether ``message`` is a step of SecAgg+ (it carries the protocol's configs)."""
    return RECORD_KEY_CONFIGS in message.content.config_records


def secure_aggregation(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """The ClientApp's ``train`` mod: Flower's ``secaggplus_mod`` for a step of SecAgg+ (it answers the key exchange
    itself and masks the reply of the step that carries fedskew's request, :mod:`.secagg`), the handler as it is for
    any other request (a deployment without secure aggregation)."""
    return secaggplus_mod(message, context, call_next) if is_secure(message) else call_next(message, context)


def make_client_app(handle: Callable[[Message, Context], Message]) -> ClientApp:
    """A ClientApp answering every request with ``handle``: Flower's train messages (fedskew's ``train`` task, through
    :func:`secure_aggregation`) and query messages (every other task, and the engine's partition census)."""
    app = ClientApp()

    @app.train(mods=[secure_aggregation])
    def train(message: Message, context: Context) -> Message:
        return handle(message, context)

    @app.query()
    def query(message: Message, context: Context) -> Message:
        return handle(message, context)

    return app
