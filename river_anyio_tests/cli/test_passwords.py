"""No output path prints a database password: every password form, over every CLI verb (at
--debug, so logs are included) and the library's start-up failures (message, repr, args,
the whole chained traceback, log records), and the drivers' repr."""

from __future__ import annotations

import io
import logging
import traceback
import urllib.parse

import pytest

import river_anyio as river
from river_anyio._cli import main
from river_anyio_tests.drivers.test_urls import PASSWORD_FORMS, secret_parts

#: The library forms, plus a URL of a kind nobody accepts.
FORMS = [*PASSWORD_FORMS, ("mysql://river:s3cretPW@127.0.0.1:1/db", "s3cretPW")]

VERB_ARGS = {
    "migrate-up": [],
    "migrate-down": ["--target-version", "0"],
    "migrate-list": [],
    "validate": [],
    "migrate-get": ["--all", "--up"],
    "bench": ["-n", "5", "--yes"],
    "demo": ["--jobs", "5", "--yes"],
}


def _assert_hidden(secret: str, *texts: str) -> None:
    for text in texts:
        for part in secret_parts(secret):
            assert part not in text, text


@pytest.fixture(autouse=True)
def _fast_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    monkeypatch.delenv("PGDATABASE", raising=False)


@pytest.mark.parametrize("verb", sorted(VERB_ARGS))
@pytest.mark.parametrize(("url", "secret"), FORMS)
def test_no_cli_verb_prints_a_password(verb: str, url: str, secret: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--debug", verb, "--database-url", url, *VERB_ARGS[verb]], stdout=out, stderr=err)
    if verb != "migrate-get":  # a hint only: nothing is opened
        assert code != 0
        assert "river-anyio: error: " in err.getvalue()
    _assert_hidden(secret, out.getvalue(), err.getvalue())


@pytest.mark.anyio
@pytest.mark.parametrize(("url", "secret"), FORMS)
async def test_start_up_failures_hide_the_password(
    url: str, secret: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="river_anyio")
    workers = river.Workers()
    with pytest.raises(Exception) as info:  # noqa: PT011 - any failure; its text is checked
        async with river.open_client(url, workers=workers):
            pass
    exc = info.value
    texts = [str(exc), repr(exc), repr(exc.args), "".join(traceback.format_exception(exc))]
    texts += [repr(getattr(exc, "value", None)), caplog.text]
    _assert_hidden(secret, *texts)
    if isinstance(exc, river.ConfigError):
        assert exc.field in ("database_url", "url")


@pytest.mark.anyio
async def test_config_errors_of_other_options_hide_it_too() -> None:
    url = "host=127.0.0.1 port=1 password=s3cretPW dbname=db"
    with pytest.raises(river.ConfigError) as info:
        async with river.open_client(url, max_attempts=0):
            pass
    _assert_hidden("s3cretPW", str(info.value), repr(info.value), repr(info.value.value))


@pytest.mark.postgres
@pytest.mark.anyio
async def test_driver_repr_hides_it(pg_url: str) -> None:
    # the test server trusts local connections, so any password is accepted
    parts = urllib.parse.urlsplit(pg_url)
    url = parts._replace(netloc=f"{parts.username}:s3cretPW@{parts.hostname}:{parts.port}")
    async with river.drivers.open_driver(urllib.parse.urlunsplit(url)) as driver:
        shown = repr(driver)
    assert "PostgresDriver" in shown and parts.hostname in shown
    _assert_hidden("s3cretPW", shown)
