"""The aiohttp internals plumbing serves with, checked against the installed release.

A different aiohttp release cannot be installed in a test, so a changed release is
simulated by deleting or replacing one name on aiohttp's classes (monkeypatch undoes
it); the check must then refuse to serve, with a message that names the release, what
changed and what to do, and each service's command line must say so in one line.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from support import LOOPBACK

from plumbing.aiohttp_internals import (
    SUPPORTED,
    AiohttpChanged,
    check_internals,
    close_if_idle,
    request_in_progress,
)
from plumbing.http_limits import HttpLimits
from plumbing.serving import handler_options, serve_app, start_site

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"
OPTIONS = handler_options(HttpLimits(), access_log=False)
WAIT_S = 5.0

Change = Callable[[pytest.MonkeyPatch], None]


def assert_clear(error: AiohttpChanged, what: str) -> None:
    """The message names the release found, what changed and what to do, on one line."""
    message = str(error)
    assert f"aiohttp {aiohttp.__version__} is not supported by plumbing: " in message
    assert what in message
    assert f"Install {SUPPORTED} (the pin in pyproject.toml)" in message
    assert "update plumbing/aiohttp_internals.py" in message
    assert "\n" not in message


# ---------------------------------------------------------------- the installed release


async def test_the_installed_aiohttp_passes_the_check() -> None:
    await check_internals(OPTIONS)


def test_the_installed_aiohttp_is_in_the_supported_range() -> None:
    version = tuple(int(part) for part in aiohttp.__version__.split(".")[:2])
    low, high = (tuple(map(int, v.split("."))) for v in re.findall(r"\d+\.\d+", SUPPORTED))
    assert low <= version < high


def test_the_pin_in_pyproject_is_the_supported_range() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    assert [d for d in dependencies if d.startswith("aiohttp")] == [SUPPORTED]


@pytest.fixture
async def slow_site() -> AsyncIterator[tuple[web.AppRunner, asyncio.Event, int]]:
    """A capped site whose one route answers once `release` is set; (runner, release, port)."""
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, **OPTIONS)
    await runner.setup()
    try:
        await start_site(runner, LOOPBACK, 0, HttpLimits(), OPTIONS)
        yield runner, release, runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def one_connection(runner: web.AppRunner) -> web.RequestHandler:
    assert runner.server is not None
    async with asyncio.timeout(WAIT_S):
        while len(runner.server.connections) != 1:
            await asyncio.sleep(0.01)
    return runner.server.connections[0]


async def test_a_request_is_in_progress_from_its_arrival_to_its_reply(
    slow_site: tuple[web.AppRunner, asyncio.Event, int],
) -> None:
    runner, release, port = slow_site
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        handler = await one_connection(runner)
        assert not request_in_progress(handler)  # connected, no request yet

        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            while not request_in_progress(handler):
                await asyncio.sleep(0.01)
        assert not close_if_idle(handler)

        release.set()
        async with asyncio.timeout(WAIT_S):
            assert (await reader.readuntil(b"done")).startswith(b"HTTP/1.1 200")
            while request_in_progress(handler):  # the flag drops once the reply is sent
                await asyncio.sleep(0.01)
        assert close_if_idle(handler)  # idle keep-alive: closed
        async with asyncio.timeout(WAIT_S):
            assert await reader.read() == b""
    finally:
        writer.close()


# ---------------------------------------------------------------- a changed release


def _without_request_flag(original: Any) -> Any:
    def init(self: web.RequestHandler, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        del self._request_in_progress

    return init


def _with_request_flag(original: Any, value: object) -> Any:
    def init(self: web.RequestHandler, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._request_in_progress = value  # type: ignore[assignment]

    return init


def _without_options(original: Any) -> Any:
    def init(self: web.RequestHandler, manager: web.Server, *, loop: Any) -> None:
        original(self, manager, loop=loop)

    return init


def _without_site_server(original: Any) -> Any:
    def init(self: web.BaseSite, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        del self._server

    return init


def _handle_error_without_message(
    self: web.RequestHandler, request: web.BaseRequest, status: int = 500, exc: Any = None
) -> web.StreamResponse:
    raise AssertionError("never called")


async def _stop_without_closing(self: web.BaseSite) -> None:
    self._runner._unreg_site(self)


HANDLER_INIT = web.RequestHandler.__init__
SITE_INIT = web.BaseSite.__init__

CHANGES: dict[str, tuple[Change, str]] = {
    "_request_in_progress removed": (
        lambda mp: mp.setattr(web.RequestHandler, "__init__", _without_request_flag(HANDLER_INIT)),
        "RequestHandler._request_in_progress is missing, expected a bool",
    ),
    "_request_in_progress not a bool": (
        lambda mp: mp.setattr(
            web.RequestHandler, "__init__", _with_request_flag(HANDLER_INIT, object())
        ),
        "RequestHandler._request_in_progress is of type object, expected a bool",
    ),
    "the handler's options refused": (
        lambda mp: mp.setattr(web.RequestHandler, "__init__", _without_options(HANDLER_INIT)),
        "RequestHandler(server, loop=..., access_log=..., keepalive_timeout=..., "
        "lingering_time=...) failed",
    ),
    "force_close removed": (
        lambda mp: mp.delattr(web.RequestHandler, "force_close"),
        "RequestHandler.force_close is missing",
    ),
    "handle_error removed": (
        lambda mp: mp.delattr(web.RequestHandler, "handle_error"),
        "RequestHandler.handle_error is missing, expected a method",
    ),
    "handle_error without message": (
        lambda mp: mp.setattr(web.RequestHandler, "handle_error", _handle_error_without_message),
        "RequestHandler.handle_error no longer takes (request, status, exc, message)",
    ),
    "log_exception removed": (
        lambda mp: mp.delattr(web.RequestHandler, "log_exception"),
        "RequestHandler.log_exception is missing, expected a method",
    ),
    "log_exception without keywords": (
        lambda mp: mp.setattr(web.RequestHandler, "log_exception", lambda self, *args: None),
        "RequestHandler.log_exception no longer takes (*args, exc_info=...)",
    ),
    "BaseRequest.writer removed": (
        lambda mp: mp.delattr(web.BaseRequest, "writer"),
        "BaseRequest.writer is missing, expected a property",
    ),
    "output_size removed": (
        lambda mp: mp.delattr(AbstractStreamWriter, "output_size"),
        "AbstractStreamWriter.output_size is missing, expected an int",
    ),
    "RequestPayloadError removed": (
        lambda mp: mp.delattr(web, "RequestPayloadError"),
        "web.RequestPayloadError is missing, expected an Exception",
    ),
    "a parser error renamed": (
        lambda mp: mp.delattr("aiohttp.http_exceptions.LineTooLong"),
        "aiohttp.http_exceptions.LineTooLong is missing, expected a subclass of "
        "HttpProcessingError",
    ),
    "BaseSite._server removed": (
        lambda mp: mp.setattr(web.BaseSite, "__init__", _without_site_server(SITE_INIT)),
        "BaseSite._server is missing, expected None before start",
    ),
    "addresses no longer from _server": (
        lambda mp: mp.setattr(web.BaseRunner, "addresses", property(lambda self: [])),
        "BaseRunner.addresses does not read BaseSite._server",
    ),
    "stop no longer closes _server": (
        lambda mp: mp.setattr(web.BaseSite, "stop", _stop_without_closing),
        "BaseSite.stop does not close BaseSite._server",
    ),
}


@pytest.mark.parametrize("change", CHANGES.keys())
async def test_a_changed_internal_fails_the_check_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    simulate, what = CHANGES[change]
    with monkeypatch.context() as mp:
        simulate(mp)
        with pytest.raises(AiohttpChanged) as excinfo:
            await check_internals(OPTIONS)
    assert_clear(excinfo.value, what)


async def test_serve_app_refuses_before_the_app_starts_or_anything_listens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[web.Application] = []

    async def on_startup(app: web.Application) -> None:
        started.append(app)

    app = web.Application()
    app.on_startup.append(on_startup)
    with monkeypatch.context() as mp:
        mp.delattr(web.RequestHandler, "handle_error")
        with pytest.raises(AiohttpChanged) as excinfo:
            await serve_app(app, LOOPBACK, 0, "service", "/")

    assert isinstance(excinfo.value, OSError)  # what the command lines report in one line
    assert_clear(excinfo.value, "RequestHandler.handle_error is missing")
    assert started == []
    assert capsys.readouterr().out == ""  # no "listening on" line


async def test_start_site_refuses_before_listening(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = web.AppRunner(web.Application(), **OPTIONS)
    await runner.setup()
    try:
        with monkeypatch.context() as mp:
            mp.delattr(web.RequestHandler, "force_close")
            with pytest.raises(AiohttpChanged):
                await start_site(runner, LOOPBACK, 0, HttpLimits(), OPTIONS)
        assert runner.addresses == []
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- the command lines

# Runs a service's command line (`-c CHANGED_AIOHTTP sink ...`) with aiohttp's
# handle_error gone, as in a release that renamed it.
CHANGED_AIOHTTP = """
import runpy, sys
from aiohttp import web

del web.RequestHandler.handle_error
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
SERVE_ARGS = {
    "sink": ("sink",),
    "publisher": ("publisher", "serve", "--sink", "http://127.0.0.1:9/events"),
}
SAYS = {
    "sink": "outbox-sink: cannot listen on 127.0.0.1:0: ",
    "publisher": "outbox-publisher: cannot listen on 127.0.0.1:0: ",
}


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["sink", "publisher"])
def test_a_service_on_a_changed_aiohttp_exits_with_one_line(
    tmp_path: Path, child_env: dict[str, str], module: str
) -> None:
    db = tmp_path / "service.db"
    args = [*SERVE_ARGS[module], "--db", str(db), "--host", LOOPBACK, "--port", "0"]

    result = subprocess.run(
        [sys.executable, "-c", CHANGED_AIOHTTP, *args],
        capture_output=True,
        text=True,
        env=child_env,
        cwd=tmp_path,
        timeout=30,
        check=False,
    )

    assert result.returncode == 1, result
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(SAYS[module] + f"aiohttp {aiohttp.__version__} is not")
    assert "RequestHandler.handle_error is missing" in result.stderr
    assert f"Install {SUPPORTED}" in result.stderr
    assert not db.exists(), "the database is not opened on an aiohttp that cannot serve"
