from testbed.simulate.cli import main

raise SystemExit(main())
