from aiorl.cli.entry import main

raise SystemExit(main())
