"""The Open Inference Protocol over REST (Starlette and raw ASGI), translating to and from the DataPlane only.

The app that serves every REST front end on one port is assembled in ``runtime.server.rest_app``.
"""
