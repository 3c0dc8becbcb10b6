"""``manage.py river_migrate``: River's migration verbs on the ``RIVER_ANYIO`` database."""

from __future__ import annotations

import io
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError, CommandParser

from river_anyio._cli import main

from ._common import settings_or_error, text_stream

VERBS = {
    "up": "migrate-up",
    "down": "migrate-down",
    "list": "migrate-list",
    "validate": "validate",
}


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "River's schema migrations on the database of settings.RIVER_ANYIO, as "
        "`river-anyio migrate-up/migrate-down/migrate-list/validate` run them: up applies "
        "the pending ones, down reverses one (or to --target-version), list marks the applied "
        "one with *, validate exits 1 while some are pending. River's tables are not Django "
        "models: Django's own `migrate` does not create them."
    )
    requires_system_checks: ClassVar[list[str]] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("verb", choices=sorted(VERBS), help="what to do")
        parser.add_argument("--line", default=None, help="migration line (default: main)")
        parser.add_argument(
            "--target-version",
            type=int,
            default=None,
            metavar="VERSION",
            help="up/down: the version to end at (down to 0 removes River's schema)",
        )
        parser.add_argument(
            "--max-steps", type=int, default=None, metavar="N", help="up/down: at most N"
        )
        parser.add_argument("--dry-run", action="store_true", help="up/down: print, apply nothing")
        parser.add_argument(
            "--show-sql", action="store_true", help="up/down: print each migration's SQL"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config, url = settings_or_error()
        verb = options["verb"]
        argv = [VERBS[verb], "--database-url", url]
        if config.schema:
            argv += ["--schema", config.schema]
        if options["line"]:
            argv += ["--line", options["line"]]
        moving = verb in ("up", "down")
        for flag in ("target_version", "max_steps"):
            if options[flag] is not None:
                if not moving:
                    raise CommandError(
                        f"--{flag.replace('_', '-')} is for up and down", returncode=2
                    )
                argv += [f"--{flag.replace('_', '-')}", str(options[flag])]
        for flag in ("dry_run", "show_sql"):
            if options[flag]:
                if not moving:
                    raise CommandError(
                        f"--{flag.replace('_', '-')} is for up and down", returncode=2
                    )
                argv.append(f"--{flag.replace('_', '-')}")
        err = io.StringIO()
        code = main(argv, stdout=text_stream(self.stdout), stderr=err)
        text = err.getvalue().strip()
        if code:
            raise CommandError(text.removeprefix("river-anyio: error: "), returncode=code)
        if text:
            self.stderr.write(text)
