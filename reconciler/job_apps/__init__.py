"""Code that runs inside argus's Ray Jobs (a task's driver and workers). Imports nothing else of argus's."""
