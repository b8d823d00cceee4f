"""From accepted request to Prefect flow run: the outbox and its reconciler."""
