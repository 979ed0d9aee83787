"""Logs for users without dashboard access: task runs' output and models' Serve messages, read from Ray. I/O."""
