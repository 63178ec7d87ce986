"""Agent long-poll capacity benchmark: python -m bench.longpoll --help."""
