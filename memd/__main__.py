import sys

from memd.cli import main

sys.exit(main())
