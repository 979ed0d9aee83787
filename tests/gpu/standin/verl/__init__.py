"""Not verl: see tests/gpu/standin/README.md."""
