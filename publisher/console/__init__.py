"""The operator console served by `publisher serve` at /console (see app.py)."""

from publisher.console.api import Source
from publisher.console.app import CONSOLE_PATH, ConsoleSettings, add_console

__all__ = ["CONSOLE_PATH", "ConsoleSettings", "Source", "add_console"]
