"""``python -m qpid_flow`` is the ``qpid-flow`` command."""

from qpid_flow.cli import main

raise SystemExit(main())
