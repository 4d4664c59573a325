"""``python -m lyre``: the ``lyre`` command (:mod:`lyre.cli`)."""

from lyre.cli import main

raise SystemExit(main())
