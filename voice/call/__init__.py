"""The call engine: the sans-I/O call core, its async shell, Realtime providers, tools, local
endpointing, and the terminal and file transports."""
