"""The server: its lifecycle, the one place where the front ends are assembled onto the core, and a worker process's main."""
