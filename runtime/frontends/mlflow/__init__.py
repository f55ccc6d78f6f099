"""MLflow's scoring routes (``mlflow models serve``): ``POST /invocations``, ``GET /health``, ``GET /version``."""
