"""The read-only status web page and its JSON API (a room of its own; reads what the status branch holds)."""
