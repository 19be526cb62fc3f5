from healthsvc.cli import main

raise SystemExit(main())
