"""The front ends: each translates one protocol's wire format onto the DataPlane's calls, side by side.

``rest`` and ``grpc`` (the Open Inference Protocol), ``torchserve`` (TorchServe's inference and management APIs),
``kserve`` (KServe V1), ``management`` (the management REST API), ``telemetry`` (access logs and the metrics port).
None imports another protocol's front end except through the shared REST and gRPC helpers; the server assembles them.
"""
