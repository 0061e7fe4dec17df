from npumanager.cli.main import main

raise SystemExit(main())
