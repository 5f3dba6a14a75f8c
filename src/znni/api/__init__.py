"""The HTTP API: FastAPI app factory, /v1 routes, schemas, security and metrics."""
