"""The ``lightning-ortho`` console script. It imports the command (and with it the Lightning package that
``LIGHTNING_ORTHO_LIGHTNING`` or the installed packages choose) only when it runs, so that a bad choice ends in one
line and exit status 2, like the command's other user errors, instead of a traceback from an import."""

from __future__ import annotations

import sys

from lightning_ortho._lightning_choice import LightningChoiceError


def main(args: list[str] | None = None) -> None:
    """Run :func:`lightning_ortho.cli.main` (``args`` replaces ``sys.argv[1:]``)."""
    try:
        from lightning_ortho.cli import main as run
    except LightningChoiceError as error:
        print(f"Lightning package not available. {error}", file=sys.stderr)
        raise SystemExit(2) from None
    run(args)


if __name__ == "__main__":
    main()
