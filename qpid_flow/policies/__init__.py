"""qpid-flow's own policies, each a plugin written only with what a third-party plugin has:
the hooks, its own destination settings and admin routes, and the control object."""
