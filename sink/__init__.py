"""The sink: an idempotent inbox that applies each event once and then ACKs it."""

from sink.app import create_app
from sink.store import Inbox

__all__ = ["Inbox", "create_app"]
