import sys

from sink.cli import main

sys.exit(main())
