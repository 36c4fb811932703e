from icml24.cli import main

raise SystemExit(main())
