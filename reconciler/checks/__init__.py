"""Checks that need more than the spec (installed tools such as verl). I/O."""
