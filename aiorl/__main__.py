from aiorl.cli import main

raise SystemExit(main())
