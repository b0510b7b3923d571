import sys

from plasticlm.cli import main

sys.exit(main())
