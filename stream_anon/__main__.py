"""``python -m stream_anon`` is the ``stream-anon`` command."""

import sys

from stream_anon.cli import main

sys.exit(main())
