from aiorl.cli.main import main

raise SystemExit(main())
