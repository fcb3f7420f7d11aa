"""`python -m attnforge.baseline BASE NOW [--gate SPEC ...]`: gate.py's comparison by itself."""

import sys

from .gate import main

sys.exit(main())
