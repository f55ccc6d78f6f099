"""MLflow models (a folder with an ``MLmodel`` file) served as MLServer's mlserver-mlflow serves them.

``runtime.mlflow.MLflowModel`` is the model class (MLServer's ``mlserver_mlflow.MLflowRuntime``);
mlflow itself is imported only when such a model loads (``pip install 'mlserver-like[mlflow]'``).
"""

from runtime.mlflow.mlflow_model import MLFLOW_MISSING, MLflowModel

__all__ = ["MLFLOW_MISSING", "MLflowModel"]
