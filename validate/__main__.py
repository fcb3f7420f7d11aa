import sys

from validate.cli import main

sys.exit(main())
