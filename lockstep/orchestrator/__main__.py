import sys

from lockstep.orchestrator.server import main

sys.exit(main())
