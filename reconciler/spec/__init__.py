"""The contract: dataclasses, schema loading, path and name policy. Pure: no I/O here.

File-system checks go through the :class:`~reconciler.spec.paths.FileSystem` interface,
implemented by :mod:`reconciler.source.localfs`.
"""
