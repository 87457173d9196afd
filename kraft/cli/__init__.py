"""The `kraft` command line (typer): one sub-app module per command group, registered in main.py."""
