"""The plugin machinery: every hook (``hookspecs``), the manager and the typed facade the
router calls hooks through (``manager``), and what plugins may do to a running router
(``control``). No Proton here."""
