"""Database URLs: River's SQLite forms, PostgreSQL URLs and key/value strings, and redaction.

The SQLite table is River's (``docs/sqlite-urls.md`` of River v0.51.2): what follows
``sqlite://`` or ``sqlite:`` is the file path, so one string opens one file in every River
client. Each form is checked by opening a real file, not only by the parsed path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from river_anyio import ConfigError
from river_anyio.drivers import dialect_of_url, open_driver, redact_url
from river_anyio.drivers.sqlite import path_from_url

#: (URL, the path it names relative to the current directory or absolute)
SQLITE_FORMS = [
    ("sqlite://river.db", "river.db"),
    ("sqlite:river.db", "river.db"),
    ("sqlite://./sub/river.db", "sub/river.db"),
    ("sqlite:sub/river.db", "sub/river.db"),
    ("sqlite://{abs}/river.db", "{abs}/river.db"),  # sqlite:///tmp/...: three slashes, absolute
    ("sqlite:{abs}/river.db", "{abs}/river.db"),  # sqlite:/tmp/...: the short absolute form
    ("sqlite://{abs}//river.db", "{abs}/river.db"),
    ("sqlite:///{abs}/river.db", "{abs}/river.db"),  # four slashes: still that absolute path
    ("SQLITE://river.db", "river.db"),
    ("sqlite://a%20b.db", "a%20b.db"),  # verbatim, as River's drivers take it
    ("sqlite://a#b.db", "a#b.db"),
    ("plain.db", "plain.db"),  # not a URL: a path, for open_sqlite
]

SQLITE_REJECTED = [
    ("sqlite://", "names no file"),
    ("sqlite:", "names no file"),
    ("sqlite:///:memory:", "an in-memory database is sqlite://:memory:"),
    ("", "names no file"),
    ("file::memory:?cache=shared", "file: URIs"),
    ("file:x.db", "file: URIs"),
    ("sqlite://river.db?_pragma=busy_timeout(5000)", "query parameters"),
    ("sqlite:///var/lib/", "names a directory"),
    ("sqlite://x\x00y.db", "NUL"),
]


@pytest.mark.parametrize(("url", "path"), SQLITE_FORMS)
def test_sqlite_url_forms_name_rivers_files(
    url: str, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "sub").mkdir(parents=True)
    monkeypatch.chdir(cwd)
    url = url.format(abs=tmp_path)
    want = os.path.join(cwd, path.format(abs=tmp_path))
    assert path_from_url(url) == os.path.normpath(want)
    if url.startswith(("sqlite", "SQLITE")):
        assert dialect_of_url(url) == "sqlite"


@pytest.mark.parametrize(
    "url", ["sqlite://:memory:", "sqlite::memory:", "SQLITE://:memory:", ":memory:"]
)
def test_rivers_in_memory_forms(url: str) -> None:
    assert path_from_url(url) == ":memory:"


@pytest.mark.parametrize(("url", "path"), SQLITE_FORMS[:8])
@pytest.mark.anyio
async def test_each_form_opens_that_file(
    url: str, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "sub").mkdir(parents=True)
    monkeypatch.chdir(cwd)
    url = url.format(abs=tmp_path)
    async with open_driver(url) as driver:
        await driver.executor().exec_script("CREATE TABLE marker (x)")
    want = Path(os.path.join(cwd, path.format(abs=tmp_path)))
    _assert_only_file(tmp_path, want)


def _assert_only_file(root: Path, want: Path) -> None:
    """``want`` exists and nothing else but SQLite's WAL companions was created."""
    assert want.is_file()
    made = {p for p in root.rglob("*") if p.is_file()}
    assert {p.name for p in made} <= {want.name, f"{want.name}-wal", f"{want.name}-shm"}
    assert {p.parent for p in made} == {want.parent}


@pytest.mark.parametrize(("url", "message"), SQLITE_REJECTED)
def test_other_sqlite_strings_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        path_from_url(url)
    assert info.value.field == "database_url"


def test_migrate_get_hint_needs_no_path() -> None:
    # River's own CLI help: `migrate-get --database-url sqlite://` only names the dialect
    assert dialect_of_url("sqlite://") == "sqlite"
    assert dialect_of_url("sqlite:") == "sqlite"


@pytest.mark.parametrize(
    "url",
    [
        "postgres://u@h/db",
        "postgresql://u@h/db",
        "POSTGRES://h",
        "postgresql:///db?host=/run/postgresql",
        "host=localhost dbname=app",
        "  dbname=app",
        "dbname = app user=u",
    ],
)
def test_postgres_urls_and_keyvalue_strings(url: str) -> None:
    assert dialect_of_url(url) == "postgres"


@pytest.mark.parametrize("url", ["mysql://u:pw@h/db", "jobs.db", "http://x", "://x"])
def test_unknown_kinds_name_the_accepted_forms(url: str) -> None:
    with pytest.raises(ConfigError, match="libpq key/value string") as info:
        dialect_of_url(url)
    assert "pw" not in str(info.value)


#: Every way a password can appear in a connection string, with the secret it must hide.
PASSWORD_FORMS = [
    ("postgres://river:s3cretPW@127.0.0.1:1/db", "s3cretPW"),
    ("postgresql://river:s3cretPW@127.0.0.1:1/db?sslmode=disable", "s3cretPW"),
    ("postgres://river:s3%40cr%2FetPW@127.0.0.1:1/db", "s3%40cr%2FetPW"),  # percent-encoded
    ("postgres://river:s3cr/etPW@127.0.0.1:1/db", "s3cr/etPW"),  # an unencoded "/"
    ("postgres://river:s3cr@etPW@127.0.0.1:1/db", "s3cr@etPW"),  # an unencoded "@"
    ("postgres://:s3cretPW@127.0.0.1:1/db", "s3cretPW"),  # no user name
    ("postgres://127.0.0.1:1/db?password=s3cretPW", "s3cretPW"),
    ("postgres://127.0.0.1:1/db?sslmode=disable&password=s3cretPW", "s3cretPW"),
    ("host=127.0.0.1 port=1 user=river password=s3cretPW dbname=db", "s3cretPW"),
    ("host=127.0.0.1 port=1 password = s3cretPW dbname=db", "s3cretPW"),
    ("host=127.0.0.1 port=1 password='s3cr etPW' dbname=db", "s3cr etPW"),  # quoted
    ("host=127.0.0.1 port=1 password='s3cr\\'etPW' dbname=db", "s3cr\\'etPW"),  # escaped quote
    ("host=127.0.0.1 port=1 sslpassword=s3cretPW dbname=db", "s3cretPW"),
]


def secret_parts(secret: str) -> list[str]:
    """The secret and the pieces a mis-split URL could show of it."""
    parts = [secret, *secret.replace("\\'", "/").replace("@", "/").replace(" ", "/").split("/")]
    return [p for p in parts if len(p) >= 4]


@pytest.mark.parametrize(("url", "secret"), PASSWORD_FORMS)
def test_redact_hides_every_password_form(url: str, secret: str) -> None:
    shown = redact_url(url)
    assert "***" in shown
    for part in secret_parts(secret):
        assert part not in shown, shown
    # embedded in a message, too
    assert secret not in redact_url(f"could not open {url!r}: nope")
    # the rest stays readable
    assert "127.0.0.1" in shown


def test_redact_keeps_what_has_no_password() -> None:
    for text in (
        "postgres://river@h:5432/db",
        "host=h dbname=d user=u",
        "sqlite:///var/lib/app/river.db",
        "no such table: river_job",
    ):
        assert redact_url(text) == text
