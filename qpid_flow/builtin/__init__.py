"""qpid-flow's own behaviour, written as plugins (each module is one plugin)."""
