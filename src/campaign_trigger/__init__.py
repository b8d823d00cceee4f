"""campaign-trigger: API-trigger campaigns of push and in-app messages, run by Prefect."""

__version__ = "0.1.0"
