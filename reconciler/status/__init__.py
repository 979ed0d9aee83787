"""Status written back to git: the status branch and git notes. I/O (rendering in documents.py is pure)."""
