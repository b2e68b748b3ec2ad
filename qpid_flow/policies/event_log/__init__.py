"""The event log (docs/events.md): the plugin that records each event (``plugin``), the
writer thread and file formats (``writers``), and the child process that writes the files
(``process``)."""
