"""The live gateway: FastAPI app, worker pool, metrics, tenants, background tuning."""
