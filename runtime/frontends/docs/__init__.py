"""The API pages: Swagger UI of the REST API (``/v2/docs``) and its OpenAPI documents, served by the server itself."""
