"""The web dashboard: server-rendered pages over the controller's own views, served on a port of its own."""
