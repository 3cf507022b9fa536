"""`python -m flashtensor ...` runs the command line (see flashtensor.cli.main)."""
from .cli.main import main

raise SystemExit(main())
