"""The agent's local socket (docs/agent-protocol.md, "Local socket").

``server`` is the agent's side; ``client`` a stdlib-only sender for processes on the node.
This package imports nothing, so importing the client costs nothing more.
"""
