"""The node daemon: runs tasks the controller orders on one GPU host and keeps them alive across its own restarts."""
