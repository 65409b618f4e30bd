"""The live gateway: FastAPI app, worker pool, drain loops, metrics, tenants, background tuning."""
