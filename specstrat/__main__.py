from specstrat.cli import main

raise SystemExit(main())
