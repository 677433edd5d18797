"""The controller runtime: what client-go and controller-runtime give a Go controller, in Python.

A REST client speaking raw JSON (client, resource, watch, errors), informers keeping caches in step
with the API server (informer, store), a rate-limited work queue (workqueue, ratelimit), leader
election, Events, JSON logs, an injectable clock, the trackers that tell a reconcile whether its
cache can be trusted (expectations, trackers), metrics under controller-runtime's names and the
HTTP serving of metrics and probes.

Nothing here knows about TrainingJobs: the package imports nothing from crd/, builders/ or the rest
of controller/, so it can be read, tested and reused on its own.
"""
