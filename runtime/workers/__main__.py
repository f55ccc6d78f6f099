"""``python -m runtime.workers FD``: run one worker process (started by the server, not by hand)."""

from .worker import main

main()
