"""Delivery: push providers (FCM HTTP v1, APNs HTTP/2), the in-app inbox, the sandbox.

The flow calls :func:`~campaign_trigger.delivery.providers.open_provider` once per app and
chunk (or per app and run), then ``await provider.send_many(messages)``; see
``delivery/base.py`` for the contract. The package imports none of its modules: what
needs only the contract (the admin commands' campaign checks) does not load the
providers' HTTP stacks.
"""
