"""A request's life after creation, driven by its Prefect flow run: cancel, the
scheduled list, and report availability. The flow run's state is the request's state.
"""
